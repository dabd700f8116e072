"""Run the collection's playbooks, or a play of given tasks, with the json stdout callback.

Shared by the unit tests that drive real ansible-playbook runs: `run` takes one of the playbooks and a shipped
inventory (test_preflight, test_evaluate_switch), `run_tasks` a list of tasks on localhost (stack/test_openpgp_keyring,
stack/test_prune_cache).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The validate play's last task: every problem of a host, one line each after a header line.
REPORT = "Report every problem found, one line each"


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


def run_tasks(tmp_path, tasks, *args, play_vars=None):
    """TASKS as one play on localhost (local connection, this interpreter), written to TMP_PATH/play.yml; ARGS go to
    ansible-playbook as given (--check, -e ...). Returns (exit status, {task name without its role prefix: result})."""
    book = Path(tmp_path) / "play.yml"
    book.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "connection": "local",
                                 "vars": {"ansible_python_interpreter": sys.executable, **(play_vars or {})},
                                 "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(book), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    results = {}
    for task in json.loads(proc.stdout)["plays"][-1]["tasks"]:
        results[task["task"]["name"].split(" : ", 1)[-1]] = task["hosts"].get("localhost", {})
    return proc.returncode, results


def report(out):
    """The lines of the validate play's report in OUT (run's json output; the header line first), [] without one."""
    for play in out["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ", 1)[-1] == REPORT:
                for res in task["hosts"].values():
                    if res.get("failed"):
                        return res["msg"].splitlines()
    return []
