"""The consistency gate: a draft served unlike it was trained accepts far less than training validated.

Training logs, per epoch, how often the draft's tokens match the target's on the validation split (for EAGLE-3
the cumulative acceptance per draft position: this and every earlier position right; for a DFlash-family draft the
expected accepted length of a block). The export records the exported epoch's figures (its manifest's
`validation`). Served, vLLM counts the same thing: the per-position acceptance and AL of the spec-decode counters.
When the two disagree by far, the draft is not served as it was trained: capture ids that are not the extraction's,
another chat mode or template, a vocabulary mapping (d2t/t2d) of another run, another attention window, all-zero
hidden states, a draft config edited after training. None of these fails loudly in vLLM - the draft just guesses.

The figure compared is the gain over no draft, AL - 1 (the tokens a step accepts besides the bonus token), served
against validated over the same number of draft positions: served gain / validated gain must be at least
`consistency_min_ratio`. The served figure comes from the prompt set closest to the validation split: `heldout`
(conversations of the same source that training never saw) when it was measured, else the first set measured.

Only the standard library: results and manifests are JSON.
"""

from pathlib import Path

from specdec_pipeline import algorithms
from specdec_pipeline.fsutil import read_json

VARIABLE = "eagle3_evaluate_consistency_min_ratio"
MIN_VALIDATED_GAIN = 0.1  # below this the validation split says too little to judge a served figure by
CAUSES = ("capture ids (the export's aux ids against the extraction's), chat mode or template, vocabulary mapping "
          "(d2t/t2d), attention window, all-zero hidden states, draft config")


def validated(run_dir, draft, tokens):
    """{"epoch", "gain", "per_position"} that training validated for DRAFT's exported epoch over TOKENS draft
    positions, from the export manifest; None when the manifest has no validation figures (e.g. a run without a
    validation split, or an export older than the figures)."""
    man = read_json(Path(run_dir) / "manifests" / f"{algorithms.step_name('export', draft)}.json") or {}
    val = (man.get("counts") or {}).get("validation") or {}
    if draft == "eagle3":
        full = val.get("full_acc")
        if not isinstance(full, list) or not full or any(not isinstance(x, (int, float)) for x in full):
            return None
        per = [float(x) for x in full[:tokens]]
        return {"epoch": (man.get("counts") or {}).get("epoch"), "gain": round(sum(per), 4),
                "per_position": [round(x, 3) for x in per]}
    eal = val.get("expected_al")
    if not isinstance(eal, (int, float)) or isinstance(eal, bool):
        return None
    return {"epoch": (man.get("counts") or {}).get("epoch"), "gain": round(float(eal) - 1.0, 4), "per_position": None}


def compared_set(res):
    """The prompt set whose served figures are compared: heldout when measured, else the first."""
    sets = list(res.get("sets") or {})
    return "heldout" if "heldout" in sets else (sets[0] if sets else None)


def _compared(run_dir, res, tokens):
    """(set name, [(draft, served gain, validated figures, served per position)]) of RES on the compared set, for
    each draft served there that training validated; TOKENS: the draft tokens when a draft's entry names none."""
    name = compared_set(res)
    if name is None:
        return None, []
    from specdec_pipeline import evaluate_drafts  # noqa: PLC0415 - evaluate_drafts imports versions (stdlib only)

    out = []
    for draft, spec in evaluate_drafts.of_results(res).items():
        mine = res["sets"][name]["variants"].get(spec["variant"])
        val = validated(run_dir, draft, spec.get("num_speculative_tokens") or tokens)
        if mine and val:
            out.append((draft, (mine.get("acceptance_length") or 1.0) - 1.0, val, mine.get("per_position") or []))
    return name, out


def check(cfg, res, report_path):
    """'' when every draft's served gain is at least consistency_min_ratio of its validated one (or the gate is
    off, or nothing validated to compare with), else the one failure line."""
    ratio = cfg.get("consistency_min_ratio")
    if ratio is None:
        return ""
    from specdec_pipeline import evaluate_drafts  # noqa: PLC0415

    name, pairs = _compared(cfg["run_dir"], res, cfg["num_speculative_tokens"])
    for draft, served, val, per_position in pairs:
        if val["gain"] >= MIN_VALIDATED_GAIN and served < ratio * val["gain"]:
            per = ", ".join(f"{x:g}" for x in per_position) or "-"
            vper = f" (per position {', '.join(f'{x:g}' for x in val['per_position'])})" if val["per_position"] else ""
            return (f"evaluate: on {name}, the {evaluate_drafts.label(draft)} accepts far less served than training "
                    f"validated for its exported epoch {val['epoch']}: served AL {1 + served:.3f} (per position {per}) "
                    f"against validated {1 + val['gain']:.3f}{vper}, {served / val['gain']:.2f} of the validated gain, "
                    f"below {VARIABLE} {ratio:g}; the draft is not served as it was trained - check {CAUSES}; "
                    f"report: {report_path}")
    return ""


def lines(run_dir, res):
    """Report lines: each draft's served gain against its validated one on the compared set (RUN_DIR's export
    manifests)."""
    from specdec_pipeline import evaluate_drafts  # noqa: PLC0415

    name, pairs = _compared(run_dir, res, 3)
    out = []
    for draft, served, val, _per in pairs:
        share = f"{served / val['gain']:.2f} of it" if val["gain"] > 0 else "nothing validated"
        out.append(f"Served against trained ({name}): the {evaluate_drafts.label(draft)} accepts AL {1 + served:.3f} "
                   f"served, {1 + val['gain']:.3f} validated for epoch {val['epoch']} ({share}).")
    return out
