"""The evaluation section of the report: its one writer.

report/evaluate.md holds the section alone; report/report.md holds it between the markers below - written there
by report.write (the pipeline's report) and replaced in place after each evaluate run. The per-position acceptance
plot is a PNG through matplotlib when the venv has it, else an SVG of our own.
"""

from pathlib import Path

from specdec_pipeline import evaluate_consistency, evaluate_drafts, evaluate_upgrade, plots
from specdec_pipeline.fsutil import atomic_path, read_json

BEGIN, END = "<!-- evaluate -->", "<!-- /evaluate -->"


def report_lines(run_dir):
    """Markdown lines of the evaluation section (empty when the stage has not run); report.py includes them."""
    res = read_json(Path(run_dir) / "evaluate" / "results.json")
    if not res or "sets" not in res:
        return []
    s = res["settings"]
    drafts = evaluate_drafts.of_results(res)
    lines = ["## Evaluation (vLLM spec decode)", "",
             "| setting | value |", "|---|---|",
             f"| engine | {res['engine']['name']} {res['vllm']} |",
             f"| draft tokens | {_draft_tokens(res, drafts)} |",
             f"| sampling | temperature {s['temperature']}, top-p {s['top_p']}, seed {s['seed']} |",
             f"| chat mode | {s['chat_mode'] or 'the template default'} |",
             f"| output | at most {s['max_tokens']} tokens, {'EOS ignored' if s['ignore_eos'] else 'stops at EOS'} |",
             f"| concurrency | {', '.join(map(str, s['concurrency']))} |",
             f"| n-gram speculation | {_ngram_text(s)} |",
             f"| AL formula | {res['al_formula']} |", ""]
    for name, ps in res["sets"].items():
        left_out = f"; {ps['too_long']} left out: longer than the context" if ps.get("too_long") else ""
        lines += [f"### Prompt set {name}", "",
                  f"{ps['count']} prompts from {ps['file']} (digest {ps['digest'][:16]}, requests "
                  f"{ps['rendered_digest'][:16]}){left_out}.", "",
                  "| variant | AL | acceptance rate | per-position acceptance | "
                  + " | ".join(f"tokens/s @{c}" for c in s["concurrency"]) + " |",
                  "|---|---|---|---|" + "---|" * len(s["concurrency"])]
        order = ["baseline", "ngram"] + [d[k] for d in drafts.values() for k in ("variant", "control")]
        for variant in order:
            r = ps["variants"].get(variant)
            if not r:
                continue
            rates = " | ".join(str(_dash(r["by_concurrency"][str(c)]["output_tokens_per_s"])) for c in s["concurrency"])
            lines.append(f"| {variant} | {_dash(r.get('acceptance_length'))} | {_dash(r.get('acceptance_rate'))} | "
                         f"{', '.join(str(x) for x in r.get('per_position', [])) or '-'} | {rates} |")
        lines.append("")
        for variant, by_c in (ps.get("speedup") or {}).items():
            what = "n-gram speculation" if variant == "ngram" else f"the {variant} draft"
            lines.append(f"Speed-up of {what} over the target alone: "
                         + ", ".join(f"{_x(x)} at concurrency {c}" for c, x in evaluate_drafts.by_concurrency(by_c)) + ".")
        if ps.get("margin_over_control") is not None:
            lines.append(f"Trained draft over the random-weight control: AL margin {ps['margin_over_control']:+.3f}.")
        lines += _against_ngram(ps, drafts)
        lines.append("")
        if len(drafts) > 1 and ps.get("drafts"):
            lines += _side_by_side(ps, drafts, s["concurrency"])
    lines += evaluate_upgrade.report_lines(run_dir, res)
    served = evaluate_consistency.lines(run_dir, res)
    lines += [*served, ""] if served else []
    lines.append(f"Gate: {res['gate']}.")
    if res.get("plot"):
        lines += ["", f"![acceptance per draft position]({res['plot']})"]
    return lines + [""]


def _against_ngram(ps, drafts):
    """One line per draft: its AL and speed-up against vLLM's n-gram speculation (the free alternative)."""
    out = []
    for name in drafts:
        e = (ps.get("drafts") or {}).get(name) or {}
        if e.get("al_over_ngram") is None:
            continue
        fast = e.get("speedup_over_ngram") or {}
        verdict = "beats" if e["al_over_ngram"] > 1 else "does not beat"
        out.append(f"The {evaluate_drafts.label(name)} {verdict} n-gram speculation: AL {_dash(e.get('acceptance_length'))} "
                   f"against {_dash(e.get('ngram_acceptance_length'))} ({e['al_over_ngram']:.2f}x)"
                   + ("; speed-up " + ", ".join(f"{x:.2f}x n-gram's at concurrency {c}" for c, x in evaluate_drafts.by_concurrency(fast))
                      if fast else "") + ".")
    return out


def _draft_tokens(res, drafts):
    if list(drafts) == ["eagle3"]:
        return res["settings"]["num_speculative_tokens"]
    return ", ".join(f"{n}: {d['num_speculative_tokens']}" + (f" (block {d['block_size']})" if d.get("block_size") else "")
                     for n, d in drafts.items())


def _side_by_side(ps, drafts, levels):
    """The drafts of one prompt set side by side: AL, per-position acceptance, draft tokens / block size, the
    control's AL and the margin, the speed-up per concurrency; then the best draft by AL and at each level."""
    lines = ["| draft | method | draft tokens / block | AL | per-position acceptance | control AL | margin | "
             + " | ".join(f"speed-up @{c}" for c in levels) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(levels)]
    for name in drafts:
        e = ps["drafts"].get(name)
        if not e:
            continue
        block = f"{e['num_speculative_tokens']} / {e['block_size']}" if e.get("block_size") else f"{e['num_speculative_tokens']} / -"
        margin = "-" if e.get("margin_over_control") is None else f"{e['margin_over_control']:+.3f}"
        lines.append(f"| {name} | {e['method']} | {block} | {_dash(e.get('acceptance_length'))} | "
                     f"{', '.join(str(x) for x in e.get('per_position') or []) or '-'} | "
                     f"{_dash(e.get('control_acceptance_length'))} | {margin} | "
                     + " | ".join(_x((e.get("speedup") or {}).get(str(c))) for c in levels) + " |")
    top = ps.get("best") or {}
    entries = {n: e for n, e in (ps.get("drafts") or {}).items() if n in drafts and e}
    said = []
    if top.get("acceptance_length"):
        said.append(f"highest AL: {top['acceptance_length']}" + _by_how_much(entries, top["acceptance_length"], _al, "{}"))
    for c, n in evaluate_drafts.by_concurrency(top.get("speedup")):
        said.append(f"fastest at concurrency {c}: {n}"
                    + _by_how_much(entries, n, lambda e, c=c: (e.get("speedup") or {}).get(c), "{:.2f}x"))
    return lines + ["", "Best draft - " + "; ".join(said) + ".", ""] if said else lines + [""]


def _al(entry):
    return entry.get("acceptance_length")


def _by_how_much(entries, winner, figure, fmt):
    """' (WINNER's figure against each other draft's, and the ratio)' where several drafts were measured."""
    mine = figure(entries.get(winner) or {})
    others = [(n, figure(e)) for n, e in entries.items() if n != winner and figure(e)]
    if mine is None or not others:
        return ""
    return " (" + fmt.format(mine) + " against " + ", ".join(
        f"{n}'s {fmt.format(v)}: {mine / v:.2f}x" for n, v in others) + ")"


def _ngram_text(s):
    if not s.get("ngram"):
        return "not measured"
    return (f"prompt lookup of {s['ngram_lookup_min']} to {s['ngram_lookup_max']} tokens, "
            f"{s['num_speculative_tokens']} draft tokens")


def _x(value):
    return "-" if value is None else f"{value:.2f}x"


def _dash(value):
    return "-" if value is None else value


def block(run_dir):
    """The section between its markers, as report.md holds it ([] when the stage has not run)."""
    section = report_lines(run_dir)
    return ["", BEGIN, *section, END] if section else []


def write(run_dir):
    """Write report/evaluate.md and put the section into report/report.md (replacing the earlier one); returns
    report.md when there is one, else evaluate.md."""
    rep_dir = Path(run_dir) / "report"
    rep_dir.mkdir(parents=True, exist_ok=True)
    section = report_lines(run_dir)
    with atomic_path(rep_dir / "evaluate.md") as tmp:
        tmp.write_text("# EAGLE-3 draft evaluation\n\n" + "\n".join(section[1:]) + "\n")
    main = rep_dir / "report.md"
    if main.is_file():
        text = main.read_text()
        if BEGIN in text and END in text:
            text = text[: text.index(BEGIN)].rstrip("\n") + "\n" + text[text.index(END) + len(END):].lstrip("\n")
        with atomic_path(main) as tmp:
            tmp.write_text(text.rstrip("\n") + "\n" + "\n".join(block(run_dir)) + "\n")
    return main if main.is_file() else rep_dir / "evaluate.md"


def plot(results, dest_dir):
    """Per-position acceptance of each draft on each prompt set: PNG through matplotlib when the venv has it, else
    our own SVG."""
    series = {f"{v} ({name})" if len(results["sets"]) > 1 else v: r["per_position"]
              for name, ps in results["sets"].items() for v, r in ps["variants"].items() if r.get("per_position")}
    width = 0.8 / max(len(series), 1)

    def draw(ax):
        for i, (name, rates) in enumerate(series.items()):
            ax.bar([p + 1 + i * width for p in range(len(rates))], [r or 0 for r in rates], width=width, label=name)

    return plots.figure(dest_dir, "acceptance", draw, {"title": "acceptance per draft position",
                                                       "xlabel": "draft position", "ylabel": "accepted share",
                                                       "ylim": (0, 1)}, legend=True, svg=lambda: _svg(series))


def _svg(series, w=420, h=240, pad=40):
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    npos = max((len(r) for r in series.values()), default=0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle">acceptance per draft position</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - 10}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{pad}" y2="24" stroke="black"/>',
             f'<text x="{pad - 4}" y="28" text-anchor="end">1</text>',
             f'<text x="{pad - 4}" y="{h - pad}" text-anchor="end">0</text>']
    group = (w - pad - 20) / max(npos, 1)
    bar_w = group * 0.8 / max(len(series), 1)
    for s, (name, rates) in enumerate(series.items()):
        colour = colours[s % len(colours)]
        for p, rate in enumerate(rates):
            bh = (h - pad - 24) * (rate or 0)
            x = pad + 10 + p * group + s * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{h - pad - bh:.1f}" width="{bar_w:.1f}" height="{bh:.1f}" fill="{colour}">'
                         f'<title>{name} position {p + 1}: {rate}</title></rect>')
        parts.append(f'<rect x="{w - 110}" y="{28 + 14 * s}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{w - 95}" y="{37 + 14 * s}">{name}</text>')
    for p in range(npos):
        parts.append(f'<text x="{pad + 10 + p * group + group * 0.4:.1f}" y="{h - pad + 14}" text-anchor="middle">{p + 1}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">draft position</text></svg>')
    return "\n".join(parts) + "\n"
