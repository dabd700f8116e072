"""Print one JSON line for the role's progress poll: {"progress": "<one line>", "finished": bool}.

argv: the run's progress.json and the async job's results file. The job has finished when its results file
holds a result without "started" (the job wrapper writes {"started": 1, ...} while it runs).
"""
import json
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
    if not p:
        return "starting"
    parts = [f"{p.get('step', '?')}: {p.get('done', 0)}/{p.get('total', '?')} {p.get('unit', '')}".rstrip()]
    if p.get("epoch") is not None:
        parts.append(f"epoch {p['epoch']}")
    if p.get("tokens_per_s"):
        parts.append(f"{p['tokens_per_s']:,.0f} tokens/s")
    if p.get("loss") is not None:
        parts.append(f"loss {sig(p['loss'])}")
    if p.get("eta_s") is not None and p.get("state", "running") == "running":
        parts.append(f"ETA {duration(p['eta_s'])}")
    return ", ".join(parts)


job = read(sys.argv[2]) if len(sys.argv) > 2 else None
print(json.dumps({"progress": line(read(sys.argv[1])), "finished": bool(job) and "started" not in job}))
