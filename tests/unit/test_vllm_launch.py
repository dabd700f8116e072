"""The launcher every managed vLLM server runs under (specdec_pipeline/vllm_launch.py), with a stand-in server
process: on SIGTERM it passes the signal on and ends the whole process group as soon as the server has ended -
not after the grace period, which it used to sit out on every stop (the handler's wait could not reap a child the
interrupted main-thread wait was holding: 20 s added to each regenerate and extraction server stop)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))

from specdec_pipeline import vllm_launch  # noqa: E402

SERVER = """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
open(sys.argv[1], "w").close()
time.sleep(120)
"""


def _group_gone(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_that_ends_on_sigterm_is_stopped_without_waiting_out_the_grace(tmp_path):
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(FILES))
    proc = subprocess.Popen([sys.executable, "-m", "specdec_pipeline.vllm_launch", sys.executable, "-c", SERVER,
                             str(ready)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the stand-in server did not start"
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=vllm_launch.GRACE_S + 15)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == -signal.SIGKILL  # the launcher ends its group, itself last
    assert _group_gone(proc.pid)
    assert took < vllm_launch.GRACE_S / 2, f"the launcher took {took:.1f} s to stop a server that ended at once"
