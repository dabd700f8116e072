"""Run one of the collection's playbooks against a shipped inventory with the json stdout callback.

Shared by the unit tests that drive real ansible-playbook runs (test_preflight, test_evaluate_switch).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(playbook, inventory, extra, raw=()):
    """ansible-playbook -i inventory/INVENTORY playbooks/PLAYBOOK -e EXTRA [-e RAW ...]: (exit status, parsed json)."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(ROOT / "inventory" / inventory),
           str(ROOT / "playbooks" / playbook), "-e", json.dumps(extra)]
    for arg in raw:
        cmd += ["-e", arg]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, json.loads(proc.stdout)
