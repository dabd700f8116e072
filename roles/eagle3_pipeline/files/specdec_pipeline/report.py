"""Run report: Markdown + PNG plots (loss per epoch, sample lengths, step times, disk use)."""

import json
import time

from specdec_pipeline import STEPS, algorithms, plots, report_evaluate
from specdec_pipeline.config import run_path
from specdec_pipeline.fsutil import atomic_path, dir_size, read_json
from specdec_pipeline.manifest import read as read_manifest


def _epoch(export_manifest):
    """', epoch N: why' of an export manifest that records the epoch it took and why (current track), else ''."""
    c = export_manifest["counts"]
    return f", epoch {c['epoch']}: {c['chosen_by']}" if c.get("chosen_by") else ""


def _plots(cfg, out):
    made = {}
    lengths = read_json(run_path(cfg, "prepare", "lengths.json"), [])
    metrics_file = run_path(cfg, "train", "metrics.jsonl")
    metrics = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()] if metrics_file.exists() else []
    per_epoch = {}
    for m in metrics:
        if "train" in m:
            per_epoch.setdefault(m["epoch"], []).append(m["train"]["loss"])
    steps = algorithms.steps(cfg, STEPS)
    mans = {s: read_manifest(cfg, s) for s in steps}
    figs = {
        "loss": ("training loss per epoch", "epoch", "mean loss",
                 lambda ax: ax.plot(sorted(per_epoch), [sum(v) / len(v) for _unused, v in sorted(per_epoch.items())], "o-"),
                 bool(per_epoch)),
        "lengths": ("sample lengths", "tokens", "samples", lambda ax: ax.hist(lengths, bins=20), bool(lengths)),
        "step_times": ("step times", "step", "seconds",
                       lambda ax: ax.bar([s for s in steps if mans[s]], [mans[s]["seconds"] for s in steps if mans[s]]),
                       any(mans.values())),
        "disk": ("disk use", "step", "MiB",
                 lambda ax: ax.bar(list(steps), [dir_size(run_path(cfg, s)) / 2**20 for s in steps]), True),
    }
    for stem, (title, xl, yl, draw, have) in figs.items():
        name = plots.figure(out, stem, draw, {"title": title, "xlabel": xl, "ylabel": yl}) if have else None
        if name:
            made[name] = title
    return made, per_epoch, lengths, mans


def write(cfg, stopped=""):
    out = run_path(cfg, "report")
    out.mkdir(parents=True, exist_ok=True)
    made, per_epoch, lengths, mans = _plots(cfg, out)
    lines = [f"# EAGLE-3 pipeline report - {cfg['target']['path']}", "",
             f"Run directory: `{cfg['run_dir']}`  ", f"Written: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", ""]
    if stopped:
        lines += [f"**Stopped:** {stopped}", ""]
    lines += ["| step | state | seconds | counts |", "|---|---|---|---|"]
    for s in mans:
        m = mans[s]
        lines.append(f"| {s} | {'done' if m else 'not run'} | {m['seconds'] if m else ''} | "
                     f"{json.dumps(m['counts'], sort_keys=True) if m else ''} |")
    lines.append("")
    if lengths:
        lines.append(f"Samples: {len(lengths)}, tokens: {sum(lengths)}, mean length {sum(lengths) / len(lengths):.1f}.")
    if per_epoch:
        lines.append("Loss per epoch: " + ", ".join(f"{e}: {sum(v) / len(v):.4f}" for e, v in sorted(per_epoch.items())))
    if mans.get("export"):
        lines.append(f"Exported draft: `{run_path(cfg, 'export')}` (eagle_aux_hidden_state_layer_ids "
                     f"{mans['export']['counts']['eagle_aux_hidden_state_layer_ids']}){_epoch(mans['export'])}.")
    for algo in algorithms.others(cfg):
        man = mans.get(algorithms.step_name("export", algo))
        if man:
            c = man["counts"]
            lines.append(f"Exported {algo} draft: `{run_path(cfg, algorithms.step_name('export', algo))}` "
                         f"(aux_hidden_state_layer_ids {c.get('aux_hidden_state_layer_ids')}, block size "
                         f"{c.get('block_size')}, {c.get('speculative_tokens')} draft tokens per step){_epoch(man)}.")
    lines.append("")
    lines += [f"![{title}]({name})" for name, title in made.items()]
    lines += report_evaluate.block(cfg["run_dir"])
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return out / "report.md"
