"""Random SIGKILLs against the patch engine on the real speculators 0.3.0 wheel x the real vLLM 0.16.0 sources
(the 4-file speculators_0_3_0 set), then the next run; prints counts.  Not a timed test.

    python benchmarks/faults_patch_engine.py [N] [--seed S]

Half of the kills land at a random rename/fsync of the run (the engine's own step), half at a random moment
of its wall time (a timer in the parent).  Each kill hits a run with state=present on the original files or
state=absent on the patched ones; after it the files are classified, state=asserted is run, then the same
state again, which must finish the set and leave no temp file or journal.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "unit" / "source_patch"), str(ROOT / "collections"), str(ROOT)]

from faults import Layout, classify, in_child, load_set  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kills", nargs="?", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    patches = load_set("speculators_0_3_0")
    counts = dict(kills=0, step_kills=0, timed_kills=0, finished_before_timer=0, other=0, mixed=0,
                  asserted_good_on_mixed=0, journal_after_kill=0, temps_after_kill=0, repaired=0,
                  temps_after_next=0, journals_after_next=0, next_run_failed=0)
    with tempfile.TemporaryDirectory() as tmp:
        lay = Layout(tmp)
        files = lay.files(patches)
        original = {f: Path(f).read_bytes() for f in files}
        lay.run(patches)
        patched = {f: Path(f).read_bytes() for f in files}
        steps, wall = {}, {}
        for state, start in (("present", original), ("absent", patched)):
            lay.reset()
            for f in files:
                Path(f).write_bytes(start[f])
            t0 = time.perf_counter()
            steps[state] = in_child(lambda s=state: lay.run(patches, state=s))[2]
            wall[state] = time.perf_counter() - t0
        started = time.perf_counter()
        while counts["kills"] < args.kills:
            state = rng.choice(["present", "absent"])
            start, goal = (original, patched) if state == "present" else (patched, original)
            lay.reset()
            for f in files:
                Path(f).write_bytes(start[f])
            if rng.random() < 0.5:
                killed, dummy, dummy = in_child(lambda: lay.run(patches, state=state), kill_at=rng.randint(1, steps[state]))
                kind = "step_kills"
            else:
                killed, dummy, dummy = in_child(lambda: lay.run(patches, state=state),
                                                kill_after=rng.uniform(0, wall[state]))
                kind = "timed_kills"
            if not killed:
                counts["finished_before_timer"] += 1
                continue
            counts["kills"] += 1
            counts[kind] += 1
            kinds = classify(lay, files, original, patched)
            left = lay.leftovers()
            counts["other"] += "other" in kinds.values()
            mixed = len(set(kinds.values())) > 1
            counts["mixed"] += mixed
            counts["journal_after_kill"] += any(p.endswith(".specdec-patch-journal.json") for p in left)
            counts["temps_after_kill"] += sum(1 for p in left if p.endswith(".tmp"))
            if mixed and not lay.run(patches, state="asserted").get("failed"):
                counts["asserted_good_on_mixed"] += 1
            try:
                again = lay.run(patches, state=state)
            except Exception:  # noqa: BLE001 - counted, the figure says it
                again = {"failed": True}
            left = lay.leftovers()
            counts["next_run_failed"] += bool(again.get("failed"))
            counts["temps_after_next"] += sum(1 for p in left if p.endswith(".tmp"))
            counts["journals_after_next"] += sum(1 for p in left if p.endswith(".json"))
            if not again.get("failed") and not left and all(Path(f).read_bytes() == goal[f] for f in files):
                counts["repaired"] += 1
        elapsed = time.perf_counter() - started
    print("patch engine fault injection: speculators 0.3.0 set (%d files) on vLLM 0.16.0 sources, seed %d"
          % (len(files), seed))
    print("kills: %(kills)d (%(step_kills)d at a random rename/fsync, %(timed_kills)d at a random moment; "
          "%(finished_before_timer)d timed runs finished first and were not counted)" % counts)
    print("rename/fsync steps per run: present %d, absent %d" % (steps["present"], steps["absent"]))
    print("files neither original nor fully written after a kill: %(other)d" % counts)
    print("mixed sets after a kill: %(mixed)d (asserted passed on a mixed set: %(asserted_good_on_mixed)d); "
          "journals left: %(journal_after_kill)d; temp files left: %(temps_after_kill)d" % counts)
    print("repaired by the next run: %(repaired)d of %(kills)d (next run failed: %(next_run_failed)d); "
          "temp files left after it: %(temps_after_next)d; journals left after it: %(journals_after_next)d"
          % counts)
    print("wall time: %.0f s, cpus: %s" % (elapsed, os.cpu_count()))
    bad = counts["other"] + counts["asserted_good_on_mixed"] + counts["temps_after_next"] + \
        counts["journals_after_next"] + (counts["kills"] - counts["repaired"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
