"""Training steps/s of the pipeline's train worker on the CPU with 1 process and with N torchrun processes (gloo,
FSDP) on the same tiny-profile data; run with the pipeline venv. CPU/gloo figures, not GPU ones.

    .cache/venvs/pipeline/bin/python benchmarks/bench_train_cpu.py [--samples 48] [--epochs 2] [--nproc 2]

The N-process run uses tests/multiproc/cpu_shim (speculators 0.3.0's torchrun path asks for an accelerator).
Every process runs one thread (OMP_NUM_THREADS=1, as torchrun sets for its workers). Prints, per run: optimizer
steps, batches (steps x processes), steps/s and batches/s between the first and the last logged step of the last
epoch (no start-up, no checkpoint save), the wall time of the whole command, and the first and last loss.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
SHIM = ROOT / "tests" / "multiproc" / "cpu_shim"


def env(*paths):
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)), PYTHONDONTWRITEBYTECODE="1",
                TORCH_COMPILE_DISABLE="1", OMP_NUM_THREADS="1")


def train(cfg, run_dir, nproc):
    worker = ["-m", "specdec_pipeline.tracks.patched.train_worker", str(cfg), "cpu"]
    if nproc == 1:
        cmd, e = [sys.executable, *worker], env(FILES)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *worker]
        e = env(SHIM, FILES)
    t = time.monotonic()
    subprocess.run(cmd, env=e, check=True, capture_output=True)
    wall = time.monotonic() - t
    rows = [json.loads(x) for x in (run_dir / "train" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "train" in r]
    last = [r for r in rows if r["epoch"] == rows[-1]["epoch"]]
    rate = (len(last) - 1) / (last[-1]["time"] - last[0]["time"])
    print(f"{nproc} process(es): {len(rows)} steps ({len(rows) * nproc} batches), last epoch {rate:.2f} steps/s = "
          f"{rate * nproc:.2f} batches/s; whole command {wall:.1f} s; loss {rows[0]['train']['loss']:.4f} -> "
          f"{rows[-1]['train']['loss']:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "specdec_pipeline", FILES / "tiny_conversations.jsonl", "build-tiny",
                        "--out", tmp / "target"], env=env(FILES), check=True, capture_output=True)
        runs = {}
        for nproc in (1, args.nproc):
            runs[nproc] = (tmp / f"run{nproc}.json", tmp / f"run{nproc}")
            runs[nproc][0].write_text(json.dumps({
                "run_dir": str(runs[nproc][1]), "target": {"path": str(tmp / "target")},
                "dataset": {"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": args.samples},
                "seq_length": 256, "vocab": {"draft_vocab_size": 128},
                "train": {"epochs": args.epochs, "total_seq_len": 256, "lr": 1e-3}}))
        subprocess.run([sys.executable, "-m", "specdec_pipeline", runs[1][0], "run", "--until", "vocab"], env=env(FILES),
                       check=True, capture_output=True)
        if args.nproc != 1:
            shutil.copytree(runs[1][1], runs[args.nproc][1])  # the same extracted data for both
        for nproc, (cfg, run_dir) in runs.items():
            train(cfg, run_dir, nproc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
