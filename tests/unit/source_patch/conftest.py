"""Real upstream artifacts laid out as installed packages in throwaway venvs."""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT))

from tests.support.upstream import fetch  # noqa: E402


@pytest.fixture(scope="session")
def vllm_tree(tmp_path_factory):
    """vllm==X sources extracted once per session: returns (package dir, PKG-INFO text)."""
    cache = {}

    def get(version):
        if version not in cache:
            sdist = fetch("vllm", version, "sdist")
            dest = tmp_path_factory.mktemp("vllm-%s" % version)
            prefix = "vllm-%s/" % version
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers()
                           if m.name.startswith(prefix + "vllm/") and (m.isfile() or m.isdir())]
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(dest, members=members)
                pkg_info = tar.extractfile(prefix + "PKG-INFO").read().decode("utf-8")
            cache[version] = (dest / "vllm", pkg_info)
        return cache[version]

    return get


def _site_packages(venv):
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.fixture
def make_venv(tmp_path, vllm_tree):
    """make_venv(spec_version, vllm_version) -> (python path, site-packages); either may be None."""

    def build(spec_version, vllm_version, name="venv"):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = _site_packages(venv)
        if spec_version:
            with zipfile.ZipFile(fetch("speculators", spec_version, "wheel")) as whl:
                whl.extractall(site)
        if vllm_version:
            pkg_dir, pkg_info = vllm_tree(vllm_version)
            os.symlink(pkg_dir, site / "vllm")
            headers = email.parser.Parser().parsestr(pkg_info, headersonly=True)
            dist_info = site / ("vllm-%s.dist-info" % headers["Version"])
            dist_info.mkdir()
            (dist_info / "METADATA").write_text(
                "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (headers["Name"], headers["Version"]))
            (dist_info / "top_level.txt").write_text("vllm\n")
        return str(venv / "bin" / "python"), site

    return build
