"""The module end to end through Ansible (action plugin + module) against localhost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import snapshot

ROOT = Path(__file__).resolve().parents[3]
PAIR = next(c for c in yaml.safe_load((Path(__file__).parent / "cases.yml").read_text())["pairs"]
            if c["id"] == "spec030-vllm0160")


def _ansible(args, python, extra=""):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m",
           "specdec.eagle3.source_patch", "-a", "python=%s patch_set=auto %s" % (python, args)] + extra.split()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), check=False)
    data = json.loads(proc.stdout)
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_through_ansible(make_venv):
    python, site = make_venv("0.3.0", "0.16.0")
    pristine = snapshot(site)
    checked = _ansible("", python, "--check --diff")
    assert checked["changed"] is True and snapshot(site) == pristine
    assert checked["patch_set"] == "speculators_0_3_0"
    applied = _ansible("", python)
    assert applied["changed"] is True
    assert sorted(r["id"][:3] for r in applied["results"] if r["state"] == "applied") == sorted(
        k for k, v in PAIR["expect"].items() if v == "A")
    again = _ansible("", python)
    assert again["changed"] is False
    asserted = _ansible("state=asserted", python)
    assert not asserted.get("failed"), asserted.get("msg")
    reverted = _ansible("state=absent", python)
    assert reverted["changed"] is True and snapshot(site) == pristine


def test_unknown_version_is_one_clear_failure(make_venv):
    python, _unused = make_venv(None, "0.16.0")
    out = _ansible("", python)
    assert out["failed"] is True
    assert "no shipped patch set matches the installed speculators not installed" in out["msg"]
