"""A child killed by a signal is reported by the signal's name: the collection's helper (module_utils, the filter
plugin), the pipeline's copy of it, the pipeline's server wrapper and the role's run task, each with a real child
that a real signal ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path[:0] = [str(ROOT / "collections"), str(FILES)]
sys.dont_write_bytecode = True  # the role copies files/ to the host: no __pycache__ there

from ansible_collections.specdec.eagle3.plugins.module_utils import exit_status  # noqa: E402
from specdec_pipeline import errors as pipeline_errors  # noqa: E402
from specdec_pipeline.serve import ServeError, VllmServer, free_port  # noqa: E402

SIGILL_SELF = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
CPU_HINT = "the CPU lacks an instruction the program uses"


def test_a_real_child_killed_by_sigill_is_named_directly_and_through_a_shell():
    direct = subprocess.run([sys.executable, "-c", SIGILL_SELF], check=False).returncode
    shell = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "{SIGILL_SELF}"; exit $?'], check=False).returncode
    assert (direct, shell) == (-signal.SIGILL, 128 + signal.SIGILL)
    assert exit_status.exit_text(direct).startswith(f"was killed by SIGILL (signal 4) - {CPU_HINT}")
    assert exit_status.exit_text(shell).startswith(f"was killed by SIGILL (signal 4; its shell reported status 132) - {CPU_HINT}")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    assert exit_status.exit_text(killed.wait()).startswith("was killed by SIGKILL (signal 9) - ")
    assert exit_status.exit_text(subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode) \
        == "exited with status 3"
    assert exit_status.exit_text(255) == "exited with status 255"  # 128 + 127 is no signal


def test_the_pipeline_copy_says_the_same():
    for status in [*range(-70, 260), None, "?"]:
        assert pipeline_errors.exit_text(status) == exit_status.exit_text(status), status


def test_a_server_killed_by_a_signal_while_starting_is_named(tmp_path):
    srv = VllmServer([sys.executable, "-c", SIGILL_SELF], port=free_port(), log_path=tmp_path / "serve.log",
                     name="test server", poll_s=0.1, stop_timeout_s=5, ready_timeout_s=30)
    msg = ""
    try:
        srv.start()
    except ServeError as err:
        msg = str(err)
    else:
        srv.stop()
        raise AssertionError("the server that died by SIGILL was reported ready")
    assert f"test server was killed by SIGILL (signal 4) - {CPU_HINT}" in msg and "while starting" in msg, msg
    assert "\n" not in msg


def test_the_run_task_names_the_signal_that_ended_the_pipeline(tmp_path):
    """roles/eagle3_pipeline/tasks/run.yml (async shell, async_status, fail) with an interpreter whose pipeline run
    (`python -m specdec_pipeline ...`) a real SIGILL ends; every other call goes to the real interpreter."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m specdec_pipeline" ]; then kill -ILL $$; fi\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    play = [{
        "name": "Run the pipeline task file", "hosts": "localhost", "gather_facts": False, "connection": "local",
        "vars": {"ansible_python_interpreter": sys.executable, "__eagle3_pipeline_python": str(python),
                 "__eagle3_pipeline_config": str(tmp_path / "run.json"), "__eagle3_pipeline_run_dir": str(run_dir),
                 "__eagle3_pipeline_become": False, "eagle3_pipeline_code_dir": str(FILES),
                 "eagle3_pipeline_work_dir": str(tmp_path), "eagle3_pipeline_poll_s": 1, "eagle3_pipeline_timeout_s": 120},
        "tasks": [{"name": "Run", "ansible.builtin.include_role": {"name": "specdec.eagle3.eagle3_pipeline",
                                                                   "tasks_from": "run"}}],
    }]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_ASYNC_DIR=str(tmp_path / "async"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(book)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    failed = [t["hosts"]["localhost"] for t in tasks if t["hosts"].get("localhost", {}).get("failed")]
    assert len(failed) == 1, proc.stdout[-3000:]
    msg = failed[0]["msg"]
    assert msg.startswith(f"eagle3_pipeline: the run was killed by SIGILL (signal 4; its shell reported status 132) - "
                          f"{CPU_HINT}"), msg
    assert f"log {run_dir}.failed.log" in msg and "\n" not in msg
