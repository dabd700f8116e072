"""One JSON line for a role's progress poll: {"progress": "<one line>", "finished": bool}.

    python -m specdec_pipeline.progress_line PROGRESS_JSON JOB_RESULTS_FILE

PROGRESS_JSON is what a long step writes (progress.Progress: the pipeline's <run>/progress.json, the evaluate
stage's <run>/evaluate/progress.json); JOB_RESULTS_FILE is the async job's results file. The job has finished when
that file holds a result without "started" (Ansible's job wrapper writes {"started": 1, ...} while it runs).
Standard library only: it runs in whatever interpreter the role polls with, once per poll. It never writes to a
terminal: its output is JSON (a control character in the message, which the pipeline user writes, stays an escape
such as \\u001b), and the narrative callback on the controller - the last hop before the user's terminal - shows
control characters as escapes when it prints the line.
"""
import json
import os
import sys


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def sig(x, digits=4):
    return f"{x:.{digits}g}" if isinstance(x, (int, float)) else str(x)


def duration(s):
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def line(p):
    if not isinstance(p, dict):
        return "starting"
    if not p.get("total") and p.get("message"):  # nothing counted yet: what it is doing
        return f"{p.get('step', '?')}: {p['message']}"
    parts = [f"{p.get('step', '?')}: {p.get('done', 0)}/{p.get('total', '?')} {p.get('unit', '')}".rstrip()]
    if p.get("epoch") is not None:
        parts.append(f"epoch {p['epoch']}")
    if p.get("tokens_per_s"):
        parts.append(f"{p['tokens_per_s']:,.0f} tokens/s")
    if p.get("loss") is not None:
        parts.append(f"loss {sig(p['loss'])}")
    if p.get("message") and p.get("state", "running") == "running":
        parts.append(str(p["message"]))
    if p.get("eta_s") is not None and p.get("state", "running") == "running":
        parts.append(f"ETA {duration(p['eta_s'])}")
    return ", ".join(parts)


def older(path, than):
    """Whether PATH was last written before THAN (False when either is missing)."""
    try:
        return os.stat(path).st_mtime_ns < os.stat(than).st_mtime_ns
    except OSError:
        return False


def main(argv):
    job = read(argv[1]) if len(argv) > 1 else None
    finished = isinstance(job, dict) and "started" not in job
    progress = read(argv[0]) if argv else None
    # Ansible's job wrapper writes the results file when the job starts and again when it ends: while the job runs,
    # a progress file older than it is the previous run's (a re-run showed the last run's "579/579 requests").
    if isinstance(job, dict) and not finished and older(argv[0], argv[1]):
        progress = None
    print(json.dumps({"progress": line(progress), "finished": finished}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
