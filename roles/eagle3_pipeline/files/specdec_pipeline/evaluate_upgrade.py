"""Acceptance after a vLLM upgrade: the history of measurements per vLLM version and the comparison after a change.

Every measurement appends one record to <run>/evaluate/history.jsonl: the vLLM that measured, the export's
digests, the settings' digest and, per prompt set, the prompts' digest, the trained draft's AL, per-position
acceptance and number of drafts - and the same for each other draft the run measured (`drafts`: dflash, dspark,
with their draft tokens per step), each compared with its own earlier figures. When a measurement's vLLM differs from the last good record's (a record whose own
comparison did not fail), the same prompt sets measured under the same settings are compared position by position:
a drop of a position's acceptance rate by more than the tolerance (eagle3_evaluate_upgrade_tolerance) fails the
stage with one line naming both versions and both figures. A failed comparison stays in results.json, so a re-run
that measures nothing fails the same way until the drop is fixed, the draft retrained, or the tolerance changed;
later comparisons are made against the last good record, never against the regressed one.

Why per position: AL = 1 + the sum of the per-position rates, so a fall at any position shows there first, and a
draft that loses its first position (the typical break: a changed aux-layer or vocabulary mapping) is caught even
when later positions were near zero anyway. The default tolerance, 0.05, is above the noise measured between
repeated measurements and between concurrency levels of one export (docs/evaluate.md: greedy decoding
repeats exactly on one vLLM; batch and kernel differences moved a position by at most 0.02 in the runs recorded
there) and well below the drop of a broken draft (a control draft in place of the trained one: its first position
falls to about 0).
"""

import json
import time
from pathlib import Path

from specdec_pipeline import evaluate_drafts, plots
from specdec_pipeline.fsutil import atomic_path

HISTORY = "history.jsonl"


def history_file(run_dir):
    return Path(run_dir) / "evaluate" / HISTORY


def history(run_dir):
    """The recorded measurements, oldest first; a damaged line (a kill while appending) is skipped."""
    path = history_file(run_dir)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "vllm" in rec:
            out.append(rec)
    return out


def _sets(res, variant="trained"):
    return {name: {"digest": s["digest"], "rendered_digest": s["rendered_digest"],
                   "acceptance_length": s["variants"][variant].get("acceptance_length"),
                   "per_position": s["variants"][variant].get("per_position") or [],
                   "drafts": s["variants"][variant].get("drafts")}
            for name, s in res["sets"].items() if variant in s["variants"]}


def _other_drafts(res):
    """{draft: {"tokens": its draft tokens per step, "sets": _sets}} of the drafts besides EAGLE-3's."""
    return {name: {"tokens": d["num_speculative_tokens"], "sets": _sets(res, d["variant"])}
            for name, d in evaluate_drafts.of_results(res).items() if name != "eagle3"}


# Settings that do not move a draft's figures: which other variants and drafts are measured, the warm-up (each
# other draft's own draft tokens are compared with its figures).
NOT_COMPARED = ("baseline", "control", "warmup_requests", "drafts", "draft_tokens", "ngram", "ngram_lookup_min",
                "ngram_lookup_max")  # the variants measured beside the draft do not move its AL


def _settings_key(res):
    """The settings a comparison requires equal (those that move the trained draft's AL)."""
    return json.dumps({k: v for k, v in res["settings"].items() if k not in NOT_COMPARED}, sort_keys=True)


def compare(cfg, res, fp):
    """The comparison of this measurement with the last good one when the vLLM changed, else None."""
    good = [r for r in history(cfg["run_dir"]) if not r.get("upgrade_failed")]
    if not good or good[-1]["vllm"] == fp["vllm"]:
        return None
    base = good[-1]
    out = {"from": base["vllm"], "to": fp["vllm"], "base_finished": base.get("finished"),
           "export_changed": base.get("export") != fp["export"], "sets": {}, "not_compared": {}}
    if base.get("settings") != _settings_key(res):
        out["not_compared"]["*"] = "the measurement settings changed since the last run"
        return out
    _compare_sets(base.get("sets", {}), _sets(res), out["sets"], out["not_compared"], "")
    for draft, now in _other_drafts(res).items():
        old = (base.get("drafts") or {}).get(draft)
        out.setdefault("drafts", {})[draft] = {}
        if not old or old.get("tokens") != now["tokens"]:
            out["not_compared"][f"* ({draft})"] = ("not measured before" if not old else
                                                   f"draft tokens {old.get('tokens')} -> {now['tokens']}")
            continue
        _compare_sets(old["sets"], now["sets"], out["drafts"][draft], out["not_compared"], f" ({draft})")
    return out


def _compare_sets(before, after, into, not_compared, suffix):
    """Per prompt set of AFTER: the comparison with BEFORE (same prompts), into INTO; or why not, into NOT_COMPARED
    (keyed by the set's name and SUFFIX)."""
    for name, now in after.items():
        old = before.get(name)
        if not old:
            not_compared[name + suffix] = "not measured before"
            continue
        if old.get("digest") != now["digest"]:
            not_compared[name + suffix] = "other prompts than before"
            continue
        pairs = [[o, n] for o, n in zip(old["per_position"], now["per_position"])]
        drops = [(o or 0) - (n or 0) for o, n in pairs]
        worst = max(range(len(drops)), key=lambda i: drops[i]) if drops else None
        into[name] = {"acceptance_length": [old["acceptance_length"], now["acceptance_length"]],
                      "per_position": pairs, "worst_position": None if worst is None else worst + 1,
                      "worst_drop": round(drops[worst], 4) if drops else 0.0,
                      "same_requests": old.get("rendered_digest") == now["rendered_digest"]}


def _compared(upgrade):
    """(draft label, prompt set, comparison) of every compared set: the trained (EAGLE-3) draft's, then the
    others'."""
    out = [("trained draft", name, c) for name, c in upgrade["sets"].items()]
    for draft, sets in (upgrade.get("drafts") or {}).items():
        out += [(evaluate_drafts.label(draft), name, c) for name, c in sets.items()]
    return out


def failure(upgrade, tolerance, report_path):
    """'' unless a compared prompt set lost more than TOLERANCE at a position (None: the check is off)."""
    if not upgrade or tolerance is None:
        return ""
    for what, name, c in _compared(upgrade):
        if c["worst_drop"] > tolerance:
            pos = c["worst_position"]
            old, new = c["per_position"][pos - 1]
            also = " (the export changed too)" if upgrade["export_changed"] else ""
            return (f"evaluate: after the vLLM change {upgrade['from']} -> {upgrade['to']}{also}, the {what}'s "
                    f"acceptance on {name} fell beyond the tolerance {tolerance:g}: AL {c['acceptance_length'][0]} -> "
                    f"{c['acceptance_length'][1]}, position {pos} {old} -> {new}; report: {report_path}")
    return ""


def describe(upgrade):
    """One line about the comparison for the play's output ('' when there was none)."""
    if not upgrade:
        return ""
    parts = [f"{name}{'' if what == 'trained draft' else ' (' + what + ')'}: AL {c['acceptance_length'][0]} -> "
             f"{c['acceptance_length'][1]} (largest drop at a position {c['worst_drop']:+g})"
             for what, name, c in _compared(upgrade)]
    parts += [f"{name}: not compared ({why})" for name, why in upgrade["not_compared"].items()]
    return f"vLLM changed {upgrade['from']} -> {upgrade['to']}: " + "; ".join(parts)


def append(cfg, res, fp, upgrade_failed):
    """Add this measurement to the history (the whole file rewritten atomically); UPGRADE_FAILED marks a measurement
    whose comparison after a vLLM change failed (never the base of a later comparison)."""
    path = history_file(cfg["run_dir"])
    records = history(cfg["run_dir"])
    records.append({"finished": time.time(), "vllm": fp["vllm"], "export": fp["export"],
                    "settings": _settings_key(res), "sets": _sets(res), "drafts": _other_drafts(res),
                    "upgrade_failed": bool(upgrade_failed)})
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records), encoding="utf-8")


def by_version(run_dir):
    """{prompt set: [(vLLM, AL of the trained draft)]} - the last good measurement per vLLM version, in the order
    the versions were first measured."""
    latest, order = {}, []
    for rec in history(run_dir):
        if rec["vllm"] not in order:
            order.append(rec["vllm"])
        if not rec.get("upgrade_failed") or rec["vllm"] not in latest:
            latest[rec["vllm"]] = rec
    out = {}
    for version in order:
        for name, s in latest[version]["sets"].items():
            out.setdefault(name, []).append((version, s["acceptance_length"]))
        for draft, d in (latest[version].get("drafts") or {}).items():
            for name, s in d["sets"].items():
                out.setdefault(f"{name} ({draft})", []).append((version, s["acceptance_length"]))
    return out


def plot(cfg, report_dir):
    """AL of the trained draft per vLLM version and prompt set (PNG with matplotlib, else SVG); None until two
    versions were measured."""
    series = by_version(cfg["run_dir"])
    versions = {v for pts in series.values() for v, _al in pts}
    if len(versions) < 2:
        return None

    def draw(ax):
        for name, pts in series.items():
            ax.plot([v for v, _al in pts], [al or 1.0 for _v, al in pts], marker="o", label=name)

    return plots.figure(report_dir, "acceptance-by-vllm", draw, {"title": "acceptance length per vLLM version",
                                                                 "xlabel": "vLLM", "ylabel": "AL (trained draft)"},
                        legend=True, svg=lambda: _svg(series))


def _svg(series, w=420, h=240, pad=40):
    versions = []
    for pts in series.values():
        versions += [v for v, _al in pts if v not in versions]
    top = max([al or 1.0 for pts in series.values() for _v, al in pts] + [2.0])
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c"]
    step = (w - pad - 30) / max(len(versions) - 1, 1)

    def xy(version, al):
        return pad + 10 + versions.index(version) * step, h - pad - (h - pad - 24) * ((al or 1.0) - 1) / (top - 1)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle">acceptance length per vLLM version</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - 10}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{pad}" y2="24" stroke="black"/>',
             f'<text x="{pad - 4}" y="28" text-anchor="end">{top:g}</text>',
             f'<text x="{pad - 4}" y="{h - pad}" text-anchor="end">1</text>']
    for s, (name, pts) in enumerate(series.items()):
        colour = colours[s % len(colours)]
        coords = [xy(v, al) for v, al in pts]
        parts.append(f'<polyline fill="none" stroke="{colour}" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"/>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{name} {v}: {al}</title></circle>'
                  for (x, y), (v, al) in zip(coords, pts)]
        parts.append(f'<text x="{w - 100}" y="{37 + 14 * s}" fill="{colour}">{name}</text>')
    for v in versions:
        parts.append(f'<text x="{xy(v, 1)[0]:.1f}" y="{h - pad + 14}" text-anchor="middle">{v}</text>')
    return "\n".join(parts) + "</svg>\n"


def report_lines(run_dir, res):
    """Markdown lines about upgrades: the comparison of the last measurement and the AL per vLLM version."""
    lines = []
    up = res.get("upgrade")
    if up:
        lines += ["### After the vLLM change", "",
                  f"{up['from']} -> {up['to']}" + (" (the export changed too)" if up["export_changed"] else "") + ".", "",
                  "| prompt set | AL before | AL after | per position before -> after | largest drop |",
                  "|---|---|---|---|---|"]
        for what, name, c in _compared(up):
            pos = ", ".join(f"{o} -> {n}" for o, n in c["per_position"])
            shown = name if what == "trained draft" else f"{name} ({what})"
            lines.append(f"| {shown} | {c['acceptance_length'][0]} | {c['acceptance_length'][1]} | {pos} | "
                         f"{c['worst_drop']:+g} (position {c['worst_position']}) |")
        lines += [f"| {name} | - | - | not compared: {why} | - |" for name, why in up["not_compared"].items()]
        lines.append("")
    table = by_version(run_dir)
    if table:
        versions = []
        for pts in table.values():
            versions += [v for v, _al in pts if v not in versions]
        lines += ["### Acceptance length per vLLM version", "", "| prompt set | " + " | ".join(versions) + " |",
                  "|---" * (1 + len(versions)) + "|"]
        for name, pts in table.items():
            got = dict(pts)
            lines.append(f"| {name} | " + " | ".join(str(got.get(v, "-")) for v in versions) + " |")
        lines.append("")
        if res.get("history_plot"):
            lines += [f"![acceptance length per vLLM version]({res['history_plot']})", ""]
    return lines
