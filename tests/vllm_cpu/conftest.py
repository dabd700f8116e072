"""vLLM's CPU builds and the production nightly's sources, laid out as installed packages."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT))

from tests.support.upstream import fetch  # noqa: E402

NIGHTLY = "0.16.0rc2.dev344+gea5f903f8"
NIGHTLY_TARBALL = "vllm-%s-py.tar.gz" % NIGHTLY


def nightly_tarball():
    """The production nightly's Python sources: CI keeps them in shared/upstream beside the checkout."""
    for base in (os.environ.get("SPECDEC_SHARED_UPSTREAM"), ROOT.parent / "shared" / "upstream"):
        if base and (Path(base) / NIGHTLY_TARBALL).is_file():
            return Path(base) / NIGHTLY_TARBALL
    return None


def _site(venv):
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.fixture
def venv_with(tmp_path):
    """venv_with(speculators_version, vllm=("wheel", dist, version) | ("nightly",)) -> (python, site)."""

    def build(spec_version, vllm):
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = _site(venv)
        with zipfile.ZipFile(fetch("speculators", spec_version, "wheel")) as whl:
            whl.extractall(site)
        if vllm[0] == "wheel":
            with zipfile.ZipFile(fetch(vllm[1], vllm[2], "wheel")) as whl:
                whl.extractall(site, [n for n in whl.namelist() if n.endswith(".py") or ".dist-info/" in n])
        else:
            tarball = nightly_tarball()
            if tarball is None:
                pytest.skip("no %s beside the checkout (shared/upstream) nor in SPECDEC_SHARED_UPSTREAM"
                            % NIGHTLY_TARBALL)
            with tarfile.open(tarball) as tar:
                tar.extractall(site, filter="data")
            dist_info = site / ("vllm-%s.dist-info" % NIGHTLY)
            dist_info.mkdir()
            (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % NIGHTLY)
            (dist_info / "top_level.txt").write_text("vllm\n")
        return str(venv / "bin" / "python"), site

    return build
