"""scripts/bootstrap: README command 1 installs only what running the job needs, every package of it pinned, and
ansible prints no warning of its own dependencies; the test toolchain comes with --dev."""

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# The two tests of what scripts/bootstrap installed run in the tool venv it made; under another controller (the
# ansible-core 2.21 container of scripts/controller-221) they say so and skip.
in_tool_venv = pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                                  reason="checks the tool venv scripts/bootstrap makes (.venv); this interpreter is not it")


def _pins(path):
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-r "):
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{path.name}: {line} is not pinned with =="
        pins[canonicalize_name(req.name)] = spec[0].version
    return pins


@in_tool_venv
def test_the_run_requirements_pin_ansible_core_and_everything_it_pulls_in():
    pins = _pins(ROOT / "requirements.txt")
    assert "ansible-core" in pins
    unpinned = []
    for name, version in pins.items():
        dist = metadata.distribution(name)
        assert dist.version == version, f"{name} {dist.version} is installed, requirements.txt pins {version}: run scripts/bootstrap"
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                if canonicalize_name(req.name) not in pins:
                    unpinned.append(f"{name} needs {text}")
    assert not unpinned, "requirements.txt leaves dependencies of the run venv unpinned: " + "; ".join(unpinned)


def test_the_test_toolchain_builds_on_the_run_requirements():
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^-r requirements\.txt$", dev, re.M)
    run = set(_pins(ROOT / "requirements.txt"))
    assert not run & set(_pins(ROOT / "requirements-dev.txt")), "requirements-dev.txt pins again what requirements.txt pins"


def test_the_toolchains_uv_is_the_version_the_ml_venv_role_pins():
    """tests/vllm_cpu/venv.py builds its venvs with the tool venv's uv, as the roles install with theirs: one version."""
    import yaml  # noqa: PLC0415

    role = yaml.safe_load((ROOT / "roles" / "ml_venv" / "defaults" / "main.yml").read_text())["ml_venv_uv_version"]
    assert _pins(ROOT / "requirements-dev.txt")["uv"] == role, "requirements-dev.txt's uv is not ml_venv_uv_version"


@in_tool_venv
def test_ansible_prints_no_warning_about_its_dependencies():
    """ansible-core 2.19 imports cryptography's DSA module (ssh agent support); cryptography 51 deprecates DSA and
    every ansible command printed a CryptographyDeprecationWarning."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "--version"], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    assert "warn" not in (proc.stdout + proc.stderr).lower(), proc.stderr


def test_the_run_path_needs_no_collection_of_the_test_toolchain():
    """--dev alone unpacks community.docker and ansible.posix (molecule's docker driver, the tests' json callback):
    nothing the job runs may use a collection beyond ansible.builtin and this one."""
    used = []
    for top in ("site.yml", "playbooks", "roles", "plugins", "inventory", "ansible.cfg"):
        for path in [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".py", ".j2", ".cfg", "") and path.name != "README.md":
                for match in re.finditer(r"\b(community|ansible\.(?:posix|utils|netcommon|windows))\.[a-z_]+", path.read_text(errors="replace")):
                    used.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not used, used


def test_bootstrap_refuses_an_unknown_argument_in_one_line():
    proc = subprocess.run([str(ROOT / "scripts" / "bootstrap"), "--devv"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "[bootstrap] unknown argument '--devv': the only one is --dev (the test toolchain)"]
