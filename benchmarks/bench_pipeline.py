"""Time each pipeline step on the tiny profile and print the figures (run with the pipeline venv).

    .cache/venvs/pipeline/bin/python benchmarks/bench_pipeline.py [--samples 48] [--epochs 2]

Prints seconds per step, extraction throughput (tokens/s), hidden-state bytes per token, and the time of a
no-op re-run (every manifest matches).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"


def pipeline(*args):
    env = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1")
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "specdec_pipeline", *map(str, args)], env=env,
                          capture_output=True, text=True, check=True)
    return time.monotonic() - t, proc.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        secs, _unused = pipeline(FILES / "tiny_conversations.jsonl", "build-tiny", "--out", tmp / "target")
        print(f"build tiny target: {secs:.1f} s")
        cfg = tmp / "run.json"
        cfg.write_text(json.dumps({
            "run_dir": str(tmp / "run"), "target": {"path": str(tmp / "target")},
            "dataset": {"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": args.samples},
            "seq_length": 256, "vocab": {"draft_vocab_size": 128},
            "train": {"epochs": args.epochs, "total_seq_len": 256, "lr": 1e-3}}))
        secs, _unused = pipeline(cfg, "run")
        print(f"full run: {secs:.1f} s wall")
        for step in ("prepare", "extract", "vocab", "train", "export"):
            man = json.loads((tmp / "run" / "manifests" / f"{step}.json").read_text())
            print(f"  {step:8s} {man['seconds']:7.2f} s  {json.dumps(man['counts'], sort_keys=True)}")
        ext = json.loads((tmp / "run" / "manifests" / "extract.json").read_text())
        c = ext["counts"]
        print(f"extract: {c['tokens'] / ext['seconds']:.0f} tokens/s, {c['bytes'] / c['tokens']:.0f} B/token on disk "
              f"({len(c['layer_ids'])} layers x {c['hidden_size']} x 2 B = {len(c['layer_ids']) * c['hidden_size'] * 2} "
              "B/token of hidden states)")
        secs, _unused = pipeline(cfg, "run")
        print(f"no-op re-run (all manifests match): {secs:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
