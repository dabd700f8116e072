"""Step 4 on the current track - train: `speculators train` (its own trainer, resume and checkpoints).

The same step trains each other draft algorithm of the run (train-<algo>, algorithms.py) from the same extraction
and vocab mapping: `--speculator-type <algo>` with the `dflash` settings, into train-<algo>/ with its own logs.
"""

import os
import re
import subprocess
import sys
import time

from specdec_pipeline import algorithms, draft, manifest, train_figures
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError, exit_text
from specdec_pipeline.fsutil import check_space, dir_size, open_step_dir, read_json, sha256_json, swap_in
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.target import load_tokenizer
from specdec_pipeline.target import text_config
from specdec_pipeline.tracks.current import rules
from specdec_pipeline.tracks.current.common import _inputs_settled, _write_manifest, stack_versions

CHECKPOINT_FILES = ("config.json", "model.safetensors")
# The console width `speculators train` logs at (rich's RichHandler reads COLUMNS; 80 when unset). rich pads every
# line to the width, so wider costs bytes on each step's record: 2000 holds a validation record of up to 14 EAGLE-3
# draft positions or a DFlash block of 32 on one line (about 120 and 33 characters a position) and a step's record
# (about 850 characters) too. A longer one wraps, and train_figures joins its lines.
LOG_COLUMNS = "2000"


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


def mask_token_id(cfg):
    """The id `speculators train --mask-token-id` gets: the tokenizer's mask token, else its pad, eos or unk token.

    EAGLE-3 drafts never use it (speculators 0.9 reads it for its P-EAGLE and DFlash drafts only), but without it
    speculators loads the target's whole processor to find one: Kimi-K2.5's image processor needs torchvision,
    which the CPU venvs leave out, and on the host it is the checkpoint's own processor code. The tokenizer alone
    answers."""
    tok = load_tokenizer(cfg)
    for tid in (tok.mask_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id):
        if tid is not None:
            return int(tid)
    raise PipelineError(f"{cfg['target']['path']}: the tokenizer has no mask, pad, eos or unk token; "
                        "`speculators train` needs one id for --mask-token-id: add one to tokenizer_config.json.")


def space_needed(cfg, epochs=None, algo="eagle3"):
    """About the bytes EPOCHS (all by default) checkpoints of ALGO's draft take (draft.py)."""
    epochs = rules.draft_epochs(cfg, algo) if epochs is None else epochs
    if algo == "eagle3":
        return draft.checkpoint_bytes(cfg, epochs)
    return draft.block_checkpoint_bytes(cfg, cfg["dflash"]["num_layers"], epochs)


def _algorithm_args(cfg, algo):
    """`speculators train` arguments of a DFlash-family draft (ALGO) beyond the data, vocabulary and trainer ones:
    its layers, block size, anchors and attention (the test-time-training options are EAGLE-3's only)."""
    dfl = cfg["dflash"]
    args = ["--num-layers", str(dfl["num_layers"]), "--block-size", str(dfl["block_size"]),
            "--max-anchors", str(dfl["max_anchors"])]
    if dfl["non_causal"]:
        args.append("--sliding-window-non-causal")
    return args


def compute_dtype(cfg):
    """The dtype `speculators train` reads the hidden states in and autocasts to (`--hidden-states-dtype`): float32
    on the CPU, bf16 (speculators' default) on a GPU. speculators 0.9.0 autocasts on the CPU too, and a CPU without
    native bf16 (AVX2 only) emulates it. DFlash also has no float32 norm before its fc layer (EAGLE-3 has), so bf16
    features would meet float32 weights there."""
    return "float32" if cfg["current"]["device"] == "cpu" else "bfloat16"


def optimizer(cfg):
    """`speculators train --optimizer`: AdamW on the CPU, speculators' default Muon on a GPU. torch's Muon runs its
    Newton-Schulz iterations in bf16 whatever the parameters' dtype, which a CPU without native bf16 (AVX2 only)
    emulates: 15 s a step of the code profile there (2026-12-06, AMD EPYC), most of it in those iterations."""
    return "adamw" if cfg["current"]["device"] == "cpu" else "muon"


def train_argv(cfg, save_dir, algo="eagle3"):
    tr, ext = cfg["train"], run_path(cfg, "extract")
    ids = read_json(ext / "data_config.json")["layer_ids"]
    if algo == "eagle3":
        shape = ["--num-layers", str(tr["num_layers"])]
        ttt = ["--ttt-steps", str(tr["ttt_steps"]), "--ttt-step-loss-decay", str(tr["ttt_step_loss_decay"])]
    else:
        shape, ttt = _algorithm_args(cfg, algo), []
    args = ["--verifier-name-or-path", cfg["target"]["path"],
            "--speculator-type", algo,
            "--data-path", str(ext / "dataset"),
            "--hidden-states-path", str(ext / "hidden_states"),
            "--hidden-states-backend", "fp8" if cfg["current"]["hs_storage"] == "fp8" else "file",
            "--on-missing", "raise",
            "--target-layer-ids", *[str(k) for k in ids[:-1]],
            "--d2t-path", str(run_path(cfg, "vocab", "d2t.npy")),
            "--t2d-path", str(run_path(cfg, "vocab", "t2d.npy")),
            "--draft-vocab-size", str(cfg["vocab"]["draft_vocab_size"]),
            *shape,
            "--epochs", str(rules.draft_epochs(cfg, algo)),
            "--lr", str(tr["lr"]),
            "--total-seq-len", str(tr["total_seq_len"]),
            *ttt,
            "--train-data-ratio", str(cfg["current"]["train_data_ratio"]),
            "--num-workers", str(cfg["current"]["num_workers"]),
            "--draft-attn-impl", attention_impl(cfg),
            "--loss-implementation", loss_impl(cfg),
            "--seed", str(tr["seed"]),
            "--mask-token-id", str(mask_token_id(cfg)),
            "--save-path", str(save_dir),
            "--log-dir", str(run_path(cfg, "logs", "speculators" if algo == "eagle3" else f"speculators-{algo}")),
            "--run-name", "specdec"]
    if cfg["current"]["device"] == "cpu":
        args += ["--hidden-states-dtype", compute_dtype(cfg), "--optimizer", optimizer(cfg)]
    if cfg["target"]["trust_remote_code"]:
        args.append("--trust-remote-code")
    if cfg["current"]["device"] == "cpu":
        return [sys.executable, "-m", "specdec_pipeline.tracks.current.backends.train_cpu", *args]
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


def trainer_env():
    """The environment `speculators train` runs in: this one, with the log's console width (LOG_COLUMNS)."""
    return {**os.environ, "COLUMNS": LOG_COLUMNS}


def validation(log_path, algo, build, epochs):
    """The train manifest's "validation": the per-epoch figures of BUILD's runs in LOG_PATH for the epochs with a
    checkpoint (EPOCHS), the epoch to export and why (train_figures); "left_out" where a record was unusable."""
    per_epoch, left_out = train_figures.read_log(log_path, algo, build)
    best, why = train_figures.choose(per_epoch, epochs, left_out, log_path.name)
    out = {"per_epoch": {str(e): per_epoch[e] for e in sorted(epochs) if e in per_epoch}, "best_epoch": best,
           "chosen_by": why}
    if any(e in left_out for e in epochs):
        out["left_out"] = {str(e): left_out[e] for e in sorted(epochs) if e in left_out}
    return out


def _train_settings(cfg, algo="eagle3"):
    for key, choices in (("draft_attn_impl", ATTN_IMPLS), ("loss_implementation", LOSS_IMPLS)):
        value = cfg["current"][key]
        if value != "auto" and value not in choices:
            raise PipelineError(f"current.{key} is {value!r}: expected auto or one of {list(choices)} (what "
                                f"`speculators train` takes); fix eagle3_pipeline_{key}.")
    if algo != "eagle3":
        problem = algorithms.speculators_problem(algo)  # the installed trainer, before anything runs
        if problem:
            raise PipelineError(problem)


def _train_plan(cfg, algo="eagle3"):
    """What the train step of ALGO decides before it writes, reading only: the settings checked, where it trains,
    and that the remaining epochs' checkpoints fit on the disk."""
    _train_settings(cfg, algo)
    step = algorithms.step_name("train", algo)
    final = run_path(cfg, step)
    out, discard, identity = manifest.plan_dir(cfg, step)
    save_dir = out / "checkpoints"
    remaining = max(rules.draft_epochs(cfg, algo) - (0 if discard else len(epochs_done(save_dir))), 0)
    check_space(step, save_dir, space_needed(cfg, remaining, algo),
                f"{remaining} epoch checkpoints of the {'' if algo == 'eagle3' else algo + ' '}draft with optimizer state"
                + (f"; the finished training in {final} is kept until the new one is complete" if out != final else ""),
                reclaim=dir_size(out) if discard else 0)
    return final, out, discard, identity


def check(cfg, algo="eagle3"):
    """The train settings of ALGO's draft, checked before the run writes anything; the disk space too when the
    extraction and vocab it would read are settled."""
    if _inputs_settled(cfg, algorithms.step_name("train", algo)):
        _train_plan(cfg, algo)
    else:
        _train_settings(cfg, algo)


def run(cfg, algo="eagle3"):
    started = time.time()
    step = algorithms.step_name("train", algo)
    final, out, discard, identity = _train_plan(cfg, algo)  # before anything in the run directory is touched
    if out != final:
        log.info("%s: config or inputs changed - training in %s; %s is kept until the new training is complete",
                 step, out, final)
    open_step_dir(step, out, discard, identity)
    save_dir = out / "checkpoints"
    argv = train_argv(cfg, save_dir, algo)
    impl, why = loss_decision(cfg)
    log_path = run_path(cfg, "logs", f"{step}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    build = sha256_json(identity)[:16]  # the runs of one build share their validation records (train_figures)
    with open(log_path, "a", encoding="utf-8") as logf:
        logf.write(train_figures.marker(build, epochs_done(save_dir)))
    log_start = log_path.stat().st_size  # this run's part of the appended log
    epochs = rules.draft_epochs(cfg, algo)
    prog = Progress(run_path(cfg, "progress.json"), step, epochs, unit="epochs")
    prog.resume_from(len(epochs_done(save_dir)))
    log.info("%s: loss implementation %s (%s)", step, impl, why)
    log.info("%s: %s (log %s)", step, " ".join(argv), log_path)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                env=trainer_env())
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
        said = train_failure(proc.returncode, text, log_path, impl, why)
        raise PipelineError(said if algo == "eagle3" else said.replace("train: ", f"{step}: ", 1))
    done = epochs_done(save_dir)
    if not done:
        raise PipelineError(f"{step}: `speculators train` finished but wrote no checkpoint under {save_dir}; see {log_path}.")
    val = validation(log_path, algo, build, done)
    kept = sorted({val["best_epoch"], done[-1]})  # the checkpoint export takes, and the last (the resume point)
    for epoch in kept:
        missing = [f for f in CHECKPOINT_FILES if not (save_dir / str(epoch) / f).exists()]
        if missing:
            raise PipelineError(f"{step}: checkpoint {save_dir / str(epoch)} lacks {missing}; see {log_path}.")
    log.info("%s: export takes epoch %s: %s", step, val["best_epoch"], val["chosen_by"])
    prog.finish(f"{len(done)} epochs")
    if out != final:
        log.info("%s: the new training is complete - replacing %s", step, final)
        swap_in(out, final)
    checkpoints = final / "checkpoints"
    counts = {"epochs": len(done), "last_epoch": done[-1], "draft_attn_impl": attention_impl(cfg),
              "loss_implementation": impl, "loss_implementation_why": why, "trainer": "speculators train"}
    if algo != "eagle3":
        counts.update(algorithm=algo, block_size=cfg["dflash"]["block_size"], num_layers=cfg["dflash"]["num_layers"],
                      max_anchors=cfg["dflash"]["max_anchors"], non_causal=cfg["dflash"]["non_causal"])
    counts.update(hidden_states_dtype=compute_dtype(cfg), optimizer=optimizer(cfg))
    counts["validation"] = val
    outputs = [checkpoints / str(e) / f for e in kept for f in CHECKPOINT_FILES]
    return _write_manifest(cfg, step, outputs, counts, started)
