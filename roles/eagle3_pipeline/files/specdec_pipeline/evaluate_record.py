"""The evaluate stage's record: what a measurement depends on (its fingerprint), whether the last one is current,
the gates, and results.json plus the manifest that let a re-run with nothing changed skip the measurement.

results.json states every setting that moves AL next to the figures: the engine and its version, the draft tokens,
temperature and top-p, the chat mode, the output cap and whether EOS was ignored, each prompt set with its digests,
the concurrency levels and the AL formula. Format 3 measures every draft the run trained side by side (`drafts`,
and per prompt set each draft's AL, per-position acceptance, speed-up per concurrency, draft tokens and block size,
its control, and how it compares with vLLM's n-gram speculation, the `ngram` variant); EAGLE-3's variants keep
their format-2 names (trained, control), and a format-2 file reads as a run of that one draft
(evaluate_drafts.of_results): the gates, the summary and the report read both.
"""

import time
from pathlib import Path

from specdec_pipeline import evaluate_consistency, evaluate_drafts, evaluate_upgrade, remote_code, versions
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.evaluate_measure import NGRAM
from specdec_pipeline.fsutil import read_json, sha256_file, sha256_json, write_json

# Settings whose change re-measures (the gates are checked on every run and are not part of the hash).
MEASURE_KEYS = ("target", "trust_remote_code", "server_args", "num_speculative_tokens", "prompt_sets", "prompts_jsonl",
                "max_prompts", "max_tokens", "ignore_eos", "temperature", "top_p", "chat_mode", "concurrency",
                "warmup_requests", "baseline", "control", "seed", "drafts", "draft_tokens", "ngram", "ngram_lookup_min",
                "ngram_lookup_max")
AL_FORMULA = "AL = 1 + accepted draft tokens / drafts (the bonus token counted; 1.0 = no draft token accepted)"
FORMAT = 3  # 3: the drafts side by side; 2 (EAGLE-3 only) is read as one draft
SWITCH = "eagle3_evaluate_trust_remote_code"  # the stage's own trust_remote_code switch (never the pipeline's)


def vllm_version(cfg):
    """"<distribution> <version>" of the vLLM in the evaluation venv (versions.py, run by its Python)."""
    found = versions.vllm_of(cfg["python"])
    if not found:
        raise PipelineError(f"evaluate: {cfg['python']} has no vLLM installed; run the eagle3_evaluate role "
                            "(it creates the evaluation venv) or fix eagle3_evaluate_venv_path.")
    return found


def settings(cfg):
    return {k: cfg[k] for k in MEASURE_KEYS}


def _export_digests(export):
    for name in ("config.json", "model.safetensors"):
        if not (export / name).is_file():
            raise PipelineError(f"evaluate: {export / name} is missing; run the pipeline stage ({export.name}) first.")
    return {n: sha256_file(export / n) for n in ("config.json", "model.safetensors")}


def fingerprint(cfg, psets, specs=None):
    """What a measurement depends on: the format, the settings, the exports (EAGLE-3's as `export`, the others' in
    `exports`), the prompts as sent, the vLLM and the target's code that runs. SPECS: evaluate_drafts.specs (by
    default the EAGLE-3 draft alone)."""
    specs = specs if specs is not None else [{"name": "eagle3", "export_dir": cfg["export_dir"]}]
    exports = {s["name"]: _export_digests(Path(s["export_dir"])) for s in specs}
    fp = {
        "format": FORMAT,
        "settings": sha256_json(settings(cfg)),
        "export": exports.pop("eagle3", None),
        "prompts": {p["name"]: p["rendered_digest"] for p in psets},
        "vllm": vllm_version(cfg),
    }
    if exports:
        fp["exports"] = exports
    ran = remote_code_files(cfg)
    if ran:  # a changed file of the target's own code re-measures
        fp["remote_code"] = ran
    return fp


def remote_code_files(cfg):
    """{name: sha256} of the target's own *.py files that run (the tokenizer here, vLLM): only with the stage's
    switch on."""
    if not cfg["trust_remote_code"]:
        return {}
    return remote_code.files_that_run(str(cfg["target"]), SWITCH)


def manifest_file(cfg):
    return Path(cfg["run_dir"]) / "manifests" / "evaluate.json"


def results_file(cfg):
    return Path(cfg["run_dir"]) / "evaluate" / "results.json"


def is_current(cfg, fp):
    man = read_json(manifest_file(cfg))
    res = results_file(cfg)
    if not man or not res.is_file():
        return False, "no manifest"
    if man.get("fingerprint") != fp:
        changed = sorted(k for k in fp if man.get("fingerprint", {}).get(k) != fp[k])
        return False, f"{', '.join(changed)} changed"
    if man.get("results_sha256") != sha256_file(res):
        return False, "results changed"
    return True, ""


def _al(entry):
    return (entry or {}).get("acceptance_length") or 1.0


def gate(cfg, res, report_path):
    """Return '' when every gate passes for every draft, else the one failure line (the first gate missed). After a
    vLLM change the comparison with the last good record comes before the consistency gate: when both miss, the line
    that names the change says more than the one that lists the usual causes."""
    drafts = evaluate_drafts.of_results(res)
    for name, s in res["sets"].items():
        for draft, spec in drafts.items():
            said = _gate_draft(cfg, name, s, draft, spec, report_path)
            if said:
                return said
    said = evaluate_upgrade.failure(res.get("upgrade"), cfg["upgrade_tolerance"], report_path)
    if said:
        return said
    return evaluate_consistency.check(cfg, res, report_path)


def _gate_draft(cfg, name, s, draft, spec, report_path):
    """The gates for one DRAFT (SPEC: its entry of evaluate_drafts.of_results) on prompt set NAME (S)."""
    mine, control = s["variants"].get(spec["variant"]), s["variants"].get(spec["control"])
    if mine is None:
        return ""
    what, al = evaluate_drafts.label(draft), _al(mine)
    if cfg["min_acceptance_length"] is not None and al < float(cfg["min_acceptance_length"]):
        return (f"evaluate: on {name}, the acceptance length {al:.3f} of the {what} is below "
                f"min_acceptance_length {float(cfg['min_acceptance_length']):g}; report: {report_path}")
    if cfg["require_beats_control"]:
        if not control:
            return "evaluate: require_beats_control is set but no control draft was measured; re-run with control on."
        if al <= _al(control):
            return (f"evaluate: on {name}, the {what} (AL {al:.3f}) does not beat the random-weight control "
                    f"draft (AL {_al(control):.3f}); report: {report_path}")
    if cfg["min_speedup"] is not None:
        level = str(cfg["speedup_concurrency"])
        got = (s.get("speedup", {}).get(spec["variant"]) or {}).get(level)
        if got is None:
            return (f"evaluate: min_speedup is set but no speed-up was measured at concurrency {level} on {name}; "
                    "measure the baseline at that concurrency (eagle3_evaluate_baseline, eagle3_evaluate_concurrency).")
        if got < float(cfg["min_speedup"]):
            return (f"evaluate: on {name} at concurrency {level}, the {what}'s speed-up {got:.3f}x is below "
                    f"min_speedup {float(cfg['min_speedup']):g}x; report: {report_path}")
    return ""


def gate_text(cfg):
    parts = []
    if cfg["min_acceptance_length"] is not None:
        parts.append(f"AL >= {float(cfg['min_acceptance_length']):g} on every prompt set")
    if cfg["require_beats_control"]:
        parts.append("trained AL > control AL" if cfg.get("drafts", ["eagle3"]) == ["eagle3"]
                     else "each draft's AL > its control's AL")
    if cfg["min_speedup"] is not None:
        parts.append(f"speed-up >= {float(cfg['min_speedup']):g}x at concurrency {cfg['speedup_concurrency']}")
    if cfg.get("consistency_min_ratio") is not None:
        parts.append(f"served AL gain >= {cfg['consistency_min_ratio']:g} of the validated one")
    if cfg["upgrade_tolerance"] is not None:
        parts.append(f"no position's acceptance down by more than {cfg['upgrade_tolerance']:g} after a vLLM change")
    return ("passed (" + ", ".join(parts) + ")") if parts else "off"


def _speedups(variants, name, levels):
    base = variants.get("baseline")
    out = {}
    for variant, r in variants.items():
        if variant == "baseline" or not base:
            continue
        out[variant] = {}
        for level in map(str, levels):
            mine = r["sets"][name]["by_concurrency"][level]["output_tokens_per_s"]
            theirs = base["sets"][name]["by_concurrency"][level]["output_tokens_per_s"]
            out[variant][level] = round(mine / theirs, 3) if mine and theirs else None
    return out


def results(cfg, variants, psets, fp, started, specs=None):
    """results.json's content for freshly measured VARIANTS of the drafts SPECS (evaluate_drafts.specs; by default
    the EAGLE-3 draft alone): per prompt set each variant's figures, the speed-ups over the baseline per
    concurrency, the EAGLE-3 draft's margin over its control, each draft side by side (`drafts`, with the best
    per figure); the drafts, the settings, the engine and the AL formula (the gate line and the upgrade comparison
    are filled in by the caller and record)."""
    dist, version = (fp["vllm"].split(" ", 1) + [""])[:2]
    specs = specs if specs is not None else [{"name": "eagle3", "method": "eagle3", "block_size": None,
                                              "num_speculative_tokens": cfg["num_speculative_tokens"],
                                              "export_dir": cfg["export_dir"], "variant": "trained",
                                              "control": "control"}]
    sets = {}
    for p in psets:
        name = p["name"]
        per = {v: dict(r["sets"][name]) | {"server_startup_s": r["server_startup_s"]}
               for v, r in variants.items()}
        margin = (round(_al(per["trained"]) - _al(per["control"]), 4) if "trained" in per and "control" in per else None)
        speedups = _speedups(variants, name, cfg["concurrency"])
        entries = {s["name"]: evaluate_drafts.set_entry(s, per, speedups, per.get(NGRAM)) for s in specs}
        sets[name] = {"count": p["count"], "digest": p["digest"], "rendered_digest": p["rendered_digest"],
                      "file": p["file"], "too_long": len(p.get("too_long", [])), "variants": per,
                      "speedup": speedups, "margin_over_control": margin, "drafts": entries,
                      "best": evaluate_drafts.best(entries, cfg["concurrency"])}
    drafts = {s["name"]: {k: s[k] for k in ("variant", "control", "method", "num_speculative_tokens", "block_size",
                                            "export_dir")} for s in specs}
    return {"format": FORMAT, "engine": {"name": "vLLM", "distribution": dist, "version": version},
            "vllm": fp["vllm"], "al_formula": AL_FORMULA, "settings": settings(cfg), "drafts": drafts, "sets": sets,
            "upgrade": None, "gate": "", "seconds": round(time.time() - started, 1)}


def record(cfg, res, fp, failure):
    """Write results.json (with the gate's line) and the manifest naming its sha256."""
    res["gate"] = failure or gate_text(cfg)
    write_json(results_file(cfg), res)
    write_json(manifest_file(cfg), {"step": "evaluate", "fingerprint": fp, "finished": time.time(),
                                    "results_sha256": sha256_file(results_file(cfg))})
    return res


def summary(res, changed, report_path, failure):
    """What the role shows: per prompt set and draft the AL and per-position acceptance, the control's AL and the
    margin, the speed-up per concurrency (the EAGLE-3 draft's also under its format-2 keys); the settings line, the
    upgrade comparison, the gate."""
    sets = {}
    lines = [settings_line(res)]
    drafts = evaluate_drafts.of_results(res)
    for name, s in res["sets"].items():
        v = s["variants"]
        trained, control = v.get("trained") or {}, v.get("control")
        speed = (s.get("speedup") or {}).get("trained") or {}
        sets[name] = {"trained_al": trained.get("acceptance_length"), "per_position": trained.get("per_position"),
                      "control_al": control.get("acceptance_length") if control else None,
                      "margin_over_control": s.get("margin_over_control"), "speedup": speed, "count": s["count"],
                      "ngram_al": (v.get(NGRAM) or {}).get("acceptance_length"), "drafts": {}}
        for draft, spec in drafts.items():
            mine, ctl = v.get(spec["variant"]), v.get(spec["control"])
            if not mine:
                continue
            fast = (s.get("speedup") or {}).get(spec["variant"]) or {}
            margin = round(_al(mine) - _al(ctl), 4) if ctl else None
            sets[name]["drafts"][draft] = {"acceptance_length": mine.get("acceptance_length"),
                                           "per_position": mine.get("per_position"),
                                           "control_al": ctl.get("acceptance_length") if ctl else None,
                                           "margin_over_control": margin, "speedup": fast}
            tokens = spec.get("num_speculative_tokens")
            shape = f"; {tokens} draft tokens of block {spec['block_size']}" if spec.get("block_size") else ""
            line = (f"{name} ({s['count']} prompts, digest {s['rendered_digest'][:12]}): AL of the "
                    f"{evaluate_drafts.label(draft)} {mine.get('acceptance_length')}{shape}, per position "
                    f"{', '.join(str(x) for x in mine.get('per_position') or []) or '-'}")
            if ctl:
                line += f"; control {ctl.get('acceptance_length')} (margin {margin:+.4f})"
            line += _against_ngram(s, spec["variant"])
            line += ("; speed-up " + ", ".join(f"{x}x at concurrency {c}" for c, x in evaluate_drafts.by_concurrency(fast))
                     if fast else "; no baseline measured")
            lines.append(line)
    up = evaluate_upgrade.describe(res.get("upgrade"))
    if up:
        lines.append(up)
    lines.append(f"gate: {res['gate'] if res.get('gate') else failure or 'off'}")
    lines.append(f"report: {report_path}")
    return {"changed": changed, "skipped": not changed, "report": str(report_path), "sets": sets,
            "vllm": res["vllm"], "gate": res.get("gate", ""), "gate_failed": bool(failure), "lines": lines}


def _against_ngram(s, variant):
    """"; n-gram AL a (the draft's AL b = r x it), speed-up ..." of one draft on one prompt set S, '' without the
    n-gram variant."""
    ngram, mine = s["variants"].get(NGRAM), s["variants"].get(variant)
    if not ngram or not mine:
        return ""
    over = over_ngram(mine, ngram)
    fast = (s.get("speedup") or {}).get(NGRAM) or {}
    return (f"; n-gram speculation AL {ngram.get('acceptance_length')} (the draft's AL is {over}x it)"
            + ("; n-gram speed-up " + ", ".join(f"{x}x at concurrency {c}" for c, x in evaluate_drafts.by_concurrency(fast)) if fast else ""))


def over_ngram(mine, ngram):
    """The draft's AL (MINE) over the n-gram variant's (NGRAM): above 1.0 the trained draft beats the free
    alternative."""
    return round(_al(mine) / _al(ngram), 3)


def draft_tokens_text(res):
    """The draft tokens per step of each draft: "3" for EAGLE-3 alone (as before), else "eagle3 3, dflash 3 of
    block 4"."""
    drafts = evaluate_drafts.of_results(res)
    if list(drafts) == ["eagle3"]:
        return str(res["settings"]["num_speculative_tokens"])
    return ", ".join(f"{n} {d['num_speculative_tokens']}" + (f" of block {d['block_size']}" if d.get("block_size") else "")
                     for n, d in drafts.items())


def settings_line(res):
    s = res["settings"]
    return (f"{res['engine']['name']} {res['vllm']}, {draft_tokens_text(res)} draft tokens, temperature "
            f"{s['temperature']}, top-p {s['top_p']}, chat mode {s['chat_mode'] or 'template default'}, at most "
            f"{s['max_tokens']} output tokens ({'EOS ignored' if s['ignore_eos'] else 'stop at EOS'}), concurrency "
            f"{', '.join(map(str, s['concurrency']))}; {res['al_formula']}")
