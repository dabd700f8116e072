"""Step 4 - train: speculators' EAGLE-3 draft model and trainer on the extracted data.

The step launches train_worker in a child process: `torchrun --nproc_per_node=N` on GPUs (one process per
GPU, FSDP inside speculators' trainer), a plain process on the CPU. Checkpoints land in train/checkpoints/<epoch>/;
a re-run resumes after the last finished epoch (speculators' checkpointer), on the GPU.
"""

import json
import os
import subprocess
import sys
import time

from specdec_pipeline import manifest
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError, StopAfter
from specdec_pipeline.fsutil import read_json
from specdec_pipeline.progress import log


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


def run(cfg):
    started = time.time()
    device, nproc = device_plan(cfg)
    out = run_path(cfg, "train")
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoints"
    prev = read_json(out / "identity.json")
    identity = {"config": manifest.sha256_json(manifest.step_config(cfg, "train")),
                "inputs": manifest.input_digests(cfg, "train")}
    # A changed config/data starts over; so does the CPU, where speculators 0.3.0 cannot resume (see train_worker).
    if prev != identity or device == "cpu":
        import shutil  # noqa: PLC0415

        if ckpt.exists():
            log.info("train: starting from epoch 0 - removing old checkpoints in %s", ckpt)
            shutil.rmtree(ckpt)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    manifest.write_json(out / "identity.json", identity)
    cmd = [sys.executable, "-m", "specdec_pipeline.train_worker", cfg["_path"], device]
    if device == "cuda":  # torchrun even for one GPU: the same FSDP + bf16 mixed-precision path as 8 GPUs
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "specdec_pipeline.train_worker", cfg["_path"], device]
    env = dict(os.environ)
    if device == "cpu":
        env.setdefault("TORCH_COMPILE_DISABLE", "1")  # the draft's torch.compile only speeds up GPUs
    log.info("train: %s", " ".join(cmd))
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0:
        raise PipelineError(f"train: the trainer exited with status {proc.returncode}; see the log above "
                            f"and {run_path(cfg, 'logs')}.")
    epochs = sorted(int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit())
    if not epochs or epochs[-1] != int(cfg["train"]["epochs"]) - 1:
        raise PipelineError(f"train: {ckpt} holds epochs {epochs}, expected up to {int(cfg['train']['epochs']) - 1}.")
    last = ckpt / str(epochs[-1])
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    counts = {"device": device, "nproc": nproc, "epochs": len(epochs), "steps": sum(1 for m in metrics if "train" in m),
              "final_loss": next((m["train"]["loss"] for m in reversed(metrics) if "train" in m), None)}
    return manifest.write(cfg, "train", [last / "config.json", last / "model.safetensors", out / "metrics.jsonl"],
                          counts, started)
