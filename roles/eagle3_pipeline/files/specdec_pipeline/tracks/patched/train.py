"""Step 4 - train: speculators' EAGLE-3 draft model and trainer on the extracted data.

The step launches train_worker in a child process: `torchrun --nproc_per_node=N` on GPUs (one process per
GPU, FSDP inside speculators' trainer), a plain process on the CPU. Checkpoints land in train/checkpoints/<epoch>/;
a re-run resumes after the last finished epoch (speculators' checkpointer), on the GPU. A training that starts
over runs in train.new/ and replaces train/ only when it has finished.
"""

import json
import os
import subprocess
import sys
import time

from specdec_pipeline import manifest, remote_code
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError, StopAfter, exit_text
from specdec_pipeline.fsutil import (
    check_space,
    dir_size,
    disk_full_error,
    free_bytes,
    open_step_dir,
    recover_swap,
    swap_in,
)
from specdec_pipeline.progress import log
from specdec_pipeline.draft import checkpoint_bytes as space_needed


def device_plan(cfg):
    """(device, nproc): cuda with train.nproc processes when a GPU is there, else cpu with one."""
    import torch  # noqa: PLC0415

    want = cfg["train"]["device"]
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise PipelineError("train.device is cuda but torch sees no GPU; check the driver or set it to auto.")
        return "cuda", max(1, min(int(cfg["train"]["nproc"]), torch.cuda.device_count()))
    if not cfg["train"]["cpu_training"]:
        raise StopAfter("train: no GPU on this host and train.cpu_training is off - the run stops after vocab; "
                        "train on a GPU host (eagle3_pipeline_train_device: cuda).")
    return "cpu", 1


def _run_trainer(cmd, env):
    """Run the trainer, passing its stderr through; returns (status, the one-line error it printed or '')."""
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    said = ""
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.startswith(WORKER_ERROR):
            said = line[len(WORKER_ERROR):].strip()
    return proc.wait(), said


WORKER_ERROR = "ERROR: "


def run(cfg):
    started = time.time()
    device, nproc = device_plan(cfg)
    final = run_path(cfg, "train")
    recover_swap(final)
    # Where the trainer writes: train/ when it resumes there (GPU, same settings), else train.new/ - the finished
    # checkpoints in train/ are replaced only when the new training has finished. A changed config/data starts
    # over; so does the CPU, where speculators 0.3.0 cannot resume (see train_worker).
    out, discard, identity = manifest.plan_dir(cfg, "train", state_name="identity.json", resume=device == "cuda",
                                               fix="delete it (the training then starts over)")
    ckpt = out / "checkpoints"
    done = len([p for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()]) if ckpt.exists() and not discard else 0
    remaining = max(int(cfg["train"]["epochs"]) - done, 0)
    check_space("train", ckpt, space_needed(cfg, remaining),
                f"{remaining} epoch checkpoints of the draft with optimizer state"
                + (f"; the finished training in {final} is kept until the new one is complete" if out != final else ""),
                reclaim=dir_size(out) if discard else 0)
    open_step_dir("train", out, discard, identity, "identity.json")
    cmd = [sys.executable, "-m", "specdec_pipeline.tracks.patched.train_worker", cfg["_path"], device, str(out)]
    if device == "cuda":  # torchrun even for one GPU: the same FSDP + bf16 mixed-precision path as 8 GPUs
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "specdec_pipeline.tracks.patched.train_worker", cfg["_path"], device, str(out)]
    env = dict(os.environ, **remote_code.switch_env(cfg))  # offline; the switch for the patched speculators
    if device == "cpu":
        env.setdefault("TORCH_COMPILE_DISABLE", "1")  # the draft's torch.compile only speeds up GPUs
    log.info("train: %s", " ".join(cmd))
    status, said = _run_trainer(cmd, env)
    if status != 0:
        if said:
            raise PipelineError(said)
        if free_bytes(ckpt) < (64 << 20):
            raise disk_full_error("train", ckpt, space_needed(cfg, remaining))
        raise PipelineError(f"train: the trainer {exit_text(status)}; see the log above "
                            f"and {run_path(cfg, 'logs')}.")
    epochs = sorted(int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit())
    if not epochs or epochs[-1] != int(cfg["train"]["epochs"]) - 1:
        raise PipelineError(f"train: {ckpt} holds epochs {epochs}, expected up to {int(cfg['train']['epochs']) - 1}.")
    if out != final:
        swap_in(out, final)
    ckpt = final / "checkpoints"
    last = ckpt / str(epochs[-1])
    metrics = [json.loads(x) for x in (final / "metrics.jsonl").read_text().splitlines() if x.strip()]
    counts = {"device": device, "nproc": nproc, "epochs": len(epochs), "steps": sum(1 for m in metrics if "train" in m),
              "final_loss": next((m["train"]["loss"] for m in reversed(metrics) if "train" in m), None)}
    return manifest.write(cfg, "train", [last / "config.json", last / "model.safetensors", final / "metrics.jsonl"],
                          counts, started)
