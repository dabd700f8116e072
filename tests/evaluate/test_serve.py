"""serve.VllmServer against real processes: each failure is one clear line and no process is left behind."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specdec_pipeline.serve import ServeError, VllmServer, free_port

HERE = Path(__file__).parent
LITTLE = HERE / "little_server.py"


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def server(tmp_path, mode, port, **kw):
    pidfile = tmp_path / f"{mode}.pids"
    srv = VllmServer([sys.executable, LITTLE, mode, port, pidfile], port=port, log_path=tmp_path / f"{mode}.log",
                     name="test server", poll_s=0.1, stop_timeout_s=5, **kw)
    return srv, pidfile


def pids_of(srv_pid, pidfile):
    return [srv_pid] + [int(x) for x in pidfile.read_text().split()]


def test_serves_and_stops_the_whole_group(tmp_path):
    port = free_port()
    srv, pidfile = server(tmp_path, "serve", port, ready_timeout_s=30)
    with srv:
        pids = pids_of(srv.proc.pid, pidfile)
        assert all(alive(p) for p in pids)
        assert srv.startup_s is not None
    assert not any(alive(p) for p in pids), "a process of the server's group survived stop()"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_exception_in_the_block_still_stops_everything(tmp_path):
    srv, pidfile = server(tmp_path, "serve", free_port(), ready_timeout_s=30)
    with pytest.raises(RuntimeError), srv:
        pids = pids_of(srv.proc.pid, pidfile)
        raise RuntimeError("measurement failed")
    assert not any(alive(p) for p in pids)


def test_port_busy_is_one_line_and_starts_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv, pidfile = server(tmp_path, "serve", port, ready_timeout_s=5)
        with pytest.raises(ServeError) as err:
            srv.start()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"port 127.0.0.1:{port} is already in use" in msg
    assert srv.proc is None and not pidfile.exists()


def test_died_at_start_names_status_and_log(tmp_path):
    srv, pidfile = server(tmp_path, "die", free_port(), ready_timeout_s=30)
    with pytest.raises(ServeError) as err:
        srv.start()
    msg = str(err.value)
    assert "\n" not in msg
    assert "exited with status 3 while starting" in msg and str(tmp_path / "die.log") in msg
    assert "failing at start on purpose" in (tmp_path / "die.log").read_text()
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the dead server's worker was left running"


def test_readiness_timeout_is_one_line_and_stops_the_group(tmp_path):
    srv, pidfile = server(tmp_path, "sleep", free_port(), ready_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(ServeError) as err:
        srv.start()
    assert time.monotonic() - started < 15
    msg = str(err.value)
    assert "\n" not in msg
    assert "was not ready at http://127.0.0.1:" in msg and "within 2 s" in msg and "sleep.log" in msg
    pids = [int(x) for x in pidfile.read_text().split()]
    assert not any(alive(p) for p in pids)


def test_sigterm_to_the_caller_stops_the_server(tmp_path):
    port = free_port()
    pidfile = tmp_path / "serve.pids"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(HERE.parents[1] / 'roles/eagle3_pipeline/files')!r})
        from specdec_pipeline.serve import VllmServer
        with VllmServer([sys.executable, {str(LITTLE)!r}, "serve", {port}, {str(pidfile)!r}], port={port},
                        log_path={str(tmp_path / 'serve.log')!r}, poll_s=0.1, stop_timeout_s=5) as srv:
            print(srv.proc.pid, flush=True)
            time.sleep(600)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid = int(caller.stdout.readline())
    pids = pids_of(server_pid, pidfile)
    assert all(alive(p) for p in pids)
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=20) == 128 + signal.SIGTERM
    assert not any(alive(p) for p in pids)
