"""The preflight stage refuses bad inventories before anything changes, with one message naming the fix.

Runs the real preflight play (playbooks/preflight.yml) against the shipped Kimi-K2.5 sample inventory with
overrides; the host is reached through a local connection so no SSH is needed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def _item_failed(item):
    """Whether one result of a looped task failed. ansible-core 2.21's json output no longer carries `failed`
    in per-item results; a failed item still carries its `exception` (and an assert its `evaluated_to: false`)."""
    if "failed" in item:
        return bool(item["failed"])
    return "exception" in item or item.get("evaluated_to") is False


def preflight(**extra):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(ROOT / "inventory" / "kimi"),
           str(ROOT / "playbooks" / "preflight.yml"), "-e", json.dumps(extra)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    out = json.loads(proc.stdout)
    failures = []
    for play in out["plays"]:
        for task in play["tasks"]:
            for res in task["hosts"].values():
                if res.get("failed"):  # a looped task carries the per-item messages in its results
                    items = [i.get("msg", "") for i in res.get("results", []) if _item_failed(i)]
                    failures.append(" ".join(items) if items else res.get("msg", ""))
    return proc.returncode, failures


def test_the_kimi_sample_passes_once_its_placeholders_are_set():
    rc, failures = preflight(**LOCAL)
    assert (rc, failures) == (0, [])


@pytest.mark.parametrize(("extra", "expected"), [
    ({}, "set ansible_host in the inventory"),
    ({"specdec_venv_path": "/root/ml-env"}, "cannot read\n/root".replace("\n", " ")),
    ({"specdec_work_dir": "data/eagle3"}, "specdec_work_dir must be an absolute path"),
    ({"specdec_gpu_count": 0}, "specdec_require_gpu is true but specdec_gpu_count is 0"),
    ({"specdec_require_gpu": False}, "specdec_install_driver is true while specdec_require_gpu is false"),
    ({"specdec_gpu_compute_capability": "sm120"}, "specdec_gpu_compute_capability like 12.0"),
    ({"specdec_extra_ca_bundle": "ca.pem"}, "specdec_extra_ca_bundle must be empty or an absolute path"),
])
def test_a_bad_inventory_fails_with_one_message(extra, expected):
    overrides = dict(LOCAL, **extra)
    if "ansible_host" not in extra and not extra:
        overrides.pop("ansible_host")
    rc, failures = preflight(**overrides)
    assert rc != 0
    assert len(failures) == 1, failures
    assert expected in failures[0], failures[0]
