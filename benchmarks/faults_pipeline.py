"""Fault injection, not a timed test: SIGKILL the tiny pipeline (prepare -> extract -> vocab -> train) at N random
moments, re-run it after each kill, and print what survived (run with the pipeline venv).

    .cache/venvs/pipeline/bin/python benchmarks/faults_pipeline.py [--kills 8] [--seed 0] [--samples 24] [--target DIR]

--target reuses a tiny target built earlier (python -m specdec_pipeline DATASET build-tiny --out DIR).

After every kill it checks the run directory as a later run would find it:
  half-written   a file under its final name that does not read back (JSON, .npy, or a sample whose sha256 is not
                 the one finished.jsonl recorded) - must be 0
  temp files     temporary files a kill left behind (the next run removes them)
and after the next run started from there:
  lost           finished samples that were gone or redone with other bytes - must be 0
  resumed        kills after which every sample finished before the kill was kept as it was (not redone)
Finally the interrupted run is completed and its samples and vocab are compared byte for byte with an
uninterrupted run.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
ENV = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1")


def cmd(cfg):
    return [sys.executable, "-m", "specdec_pipeline", str(cfg), "run", "--until", "train"]


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def finished_records(extract_dir):
    out = {}
    path = extract_dir / "finished.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line: the next run cuts it off
            out[rec["id"]] = rec
    return out


def inspect(run_dir):
    """(half-written files, temp files, {sample path: (inode, mtime, sha256)} of the finished samples)."""
    half, temps, kept = [], [], {}
    for p in sorted(run_dir.rglob("*")):
        if not p.is_file():
            continue
        if p.name.endswith(".tmp"):
            temps.append(p)
            continue
        try:
            if p.suffix == ".json":
                json.loads(p.read_text())
            elif p.suffix == ".npy":
                np.load(p)
        except (ValueError, OSError) as exc:
            half.append(f"{p}: {exc}")
    for name in ("extract", "extract.new"):
        d = run_dir / name
        for i, rec in finished_records(d).items():
            p = d / f"data_{i}.pt"
            if not p.exists() or sha(p) != rec["sha256"]:
                half.append(f"{p}: not the recorded sample")
            else:
                st = p.stat()
                kept[str(p)] = (st.st_ino, st.st_mtime_ns, rec["sha256"])
    return half, temps, kept


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--target", help="an existing tiny target directory (default: build one)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        target = Path(args.target) if args.target else tmp / "target"
        if not args.target:
            subprocess.run([sys.executable, "-m", "specdec_pipeline", str(FILES / "tiny_conversations.jsonl"),
                            "build-tiny", "--out", str(target)], env=ENV, check=True, capture_output=True)

        def config(name):
            cfg = tmp / f"{name}.json"
            cfg.write_text(json.dumps({
                "run_dir": str(tmp / name), "target": {"path": str(target)},
                "dataset": {"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": args.samples},
                "seq_length": 256, "vocab": {"draft_vocab_size": 128},
                "train": {"epochs": 1, "total_seq_len": 256, "lr": 1e-3}}))
            return cfg

        t = time.monotonic()
        subprocess.run(cmd(config("reference")), env=ENV, check=True, capture_output=True)
        span = time.monotonic() - t
        print(f"uninterrupted run (prepare..train): {span:.1f} s; kills land uniformly in [0.5 s, {span:.1f} s]")

        cfg = config("faulted")
        run_dir = tmp / "faulted"
        counts = {"kills": 0, "finished before the kill": 0, "resumed exactly": 0, "outputs lost": 0,
                  "half-written files found": 0, "temp files left by a kill": 0}
        at_step = {}
        kept = {}
        for dummy in range(args.kills):
            proc = subprocess.Popen(cmd(cfg), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            time.sleep(rng.uniform(0.5, span))
            if proc.poll() is not None:  # the run ended first: start over from nothing
                counts["finished before the kill"] += 1
                shutil.rmtree(run_dir, ignore_errors=True)
                kept = {}
                continue
            os.killpg(proc.pid, signal.SIGKILL)  # the trainer child too
            proc.wait()
            counts["kills"] += 1
            try:
                step = json.loads((run_dir / "progress.json").read_text()).get("step", "?")
            except (OSError, ValueError):
                step = "start"
            at_step[step] = at_step.get(step, 0) + 1
            # what the previous kill left finished must still be there, untouched, after this run
            lost = [p for p, (ino, mtime, digest) in kept.items()
                    if not Path(p).exists() and not Path(p.replace("extract.new", "extract")).exists()]
            redone = [p for p, (ino, mtime, digest) in kept.items() if Path(p).exists()
                      and (Path(p).stat().st_ino, Path(p).stat().st_mtime_ns) != (ino, mtime)]
            changed = [p for p in redone if sha(Path(p)) != kept[p][2]]
            counts["outputs lost"] += len(lost) + len(changed)
            half, temps, kept = inspect(run_dir)
            counts["half-written files found"] += len(half)
            counts["temp files left by a kill"] += len(temps)
            for h in half:
                print("  half-written:", h)
            if not redone and not lost:
                counts["resumed exactly"] += 1
        subprocess.run(cmd(cfg), env=ENV, check=True, capture_output=True)
        half, temps, dummy = inspect(run_dir)
        counts["half-written files found"] += len(half)
        same = all(sha(p) == sha(run_dir / p.relative_to(tmp / "reference"))
                   for d in ("extract", "vocab") for p in sorted((tmp / "reference" / d).glob("*"))
                   if p.name != "state.json")
        print(f"kills by step: {json.dumps(at_step, sort_keys=True)}")
        for key, value in counts.items():
            print(f"{key}: {value}")
        print(f"temp files after the final run: {len(temps)}")
        print(f"final samples and vocab byte-identical to the uninterrupted run: {'yes' if same else 'NO'}")
    return 0 if counts["outputs lost"] == 0 and counts["half-written files found"] == 0 and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
