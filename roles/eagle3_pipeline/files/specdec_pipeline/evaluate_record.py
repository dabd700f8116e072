"""The evaluate stage's record: what a measurement depends on (its fingerprint), whether the last one is current,
the gates, and results.json plus the manifest that let a re-run with nothing changed skip the measurement.

results.json states every setting that moves AL next to the figures: the engine and its version, the draft tokens,
temperature and top-p, the chat mode, the output cap and whether EOS was ignored, each prompt set with its digests,
the concurrency levels and the AL formula.
"""

import time
from pathlib import Path

from specdec_pipeline import evaluate_upgrade, remote_code, versions
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import read_json, sha256_file, sha256_json, write_json

# Settings whose change re-measures (the gates are checked on every run and are not part of the hash).
MEASURE_KEYS = ("target", "trust_remote_code", "server_args", "num_speculative_tokens", "prompt_sets", "prompts_jsonl",
                "max_prompts", "max_tokens", "ignore_eos", "temperature", "top_p", "chat_mode", "concurrency",
                "warmup_requests", "baseline", "control", "seed")
AL_FORMULA = "AL = 1 + accepted draft tokens / drafts (the bonus token counted; 1.0 = no draft token accepted)"
FORMAT = 2
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


def fingerprint(cfg, psets):
    export = Path(cfg["export_dir"])
    for name in ("config.json", "model.safetensors"):
        if not (export / name).is_file():
            raise PipelineError(f"evaluate: {export / name} is missing; run the pipeline stage (export) first.")
    fp = {
        "format": FORMAT,
        "settings": sha256_json(settings(cfg)),
        "export": {n: sha256_file(export / n) for n in ("config.json", "model.safetensors")},
        "prompts": {p["name"]: p["rendered_digest"] for p in psets},
        "vllm": vllm_version(cfg),
    }
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
    """Return '' when every gate passes, else the one failure line (the first gate missed)."""
    for name, s in res["sets"].items():
        trained, control = s["variants"]["trained"], s["variants"].get("control")
        al = _al(trained)
        if cfg["min_acceptance_length"] is not None and al < float(cfg["min_acceptance_length"]):
            return (f"evaluate: on {name}, the acceptance length {al:.3f} of the trained draft is below "
                    f"min_acceptance_length {float(cfg['min_acceptance_length']):g}; report: {report_path}")
        if cfg["require_beats_control"]:
            if not control:
                return "evaluate: require_beats_control is set but no control draft was measured; re-run with control on."
            if al <= _al(control):
                return (f"evaluate: on {name}, the trained draft (AL {al:.3f}) does not beat the random-weight control "
                        f"draft (AL {_al(control):.3f}); report: {report_path}")
        if cfg["min_speedup"] is not None:
            level = str(cfg["speedup_concurrency"])
            got = (s.get("speedup", {}).get("trained") or {}).get(level)
            if got is None:
                return (f"evaluate: min_speedup is set but no speed-up was measured at concurrency {level} on {name}; "
                        "measure the baseline at that concurrency (eagle3_evaluate_baseline, eagle3_evaluate_concurrency).")
            if got < float(cfg["min_speedup"]):
                return (f"evaluate: on {name} at concurrency {level}, the trained draft's speed-up {got:.3f}x is below "
                        f"min_speedup {float(cfg['min_speedup']):g}x; report: {report_path}")
    return evaluate_upgrade.failure(res.get("upgrade"), cfg["upgrade_tolerance"], report_path)


def gate_text(cfg):
    parts = []
    if cfg["min_acceptance_length"] is not None:
        parts.append(f"AL >= {float(cfg['min_acceptance_length']):g} on every prompt set")
    if cfg["require_beats_control"]:
        parts.append("trained AL > control AL")
    if cfg["min_speedup"] is not None:
        parts.append(f"speed-up >= {float(cfg['min_speedup']):g}x at concurrency {cfg['speedup_concurrency']}")
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


def results(cfg, variants, psets, fp, started):
    """results.json's content for freshly measured VARIANTS: per prompt set each variant's figures, the speed-ups
    over the baseline per concurrency, the margin over the control; the settings, the engine and the AL formula
    (the gate line and the upgrade comparison are filled in by the caller and record)."""
    dist, version = (fp["vllm"].split(" ", 1) + [""])[:2]
    sets = {}
    for p in psets:
        name = p["name"]
        per = {v: dict(r["sets"][name]) | {"server_startup_s": r["server_startup_s"]}
               for v, r in variants.items()}
        margin = (round(_al(per["trained"]) - _al(per["control"]), 4) if "control" in per else None)
        sets[name] = {"count": p["count"], "digest": p["digest"], "rendered_digest": p["rendered_digest"],
                      "file": p["file"], "too_long": len(p.get("too_long", [])), "variants": per,
                      "speedup": _speedups(variants, name, cfg["concurrency"]), "margin_over_control": margin}
    return {"format": FORMAT, "engine": {"name": "vLLM", "distribution": dist, "version": version},
            "vllm": fp["vllm"], "al_formula": AL_FORMULA, "settings": settings(cfg), "sets": sets,
            "upgrade": None, "gate": "", "seconds": round(time.time() - started, 1)}


def record(cfg, res, fp, failure):
    """Write results.json (with the gate's line) and the manifest naming its sha256."""
    res["gate"] = failure or gate_text(cfg)
    write_json(results_file(cfg), res)
    write_json(manifest_file(cfg), {"step": "evaluate", "fingerprint": fp, "finished": time.time(),
                                    "results_sha256": sha256_file(results_file(cfg))})
    return res


def summary(res, changed, report_path, failure):
    """What the role shows: per prompt set the trained draft's AL and per-position acceptance, the control's AL and
    the margin, the speed-up per concurrency; the settings line, the upgrade comparison, the gate."""
    sets = {}
    lines = [settings_line(res)]
    for name, s in res["sets"].items():
        v = s["variants"]
        trained, control = v["trained"], v.get("control")
        speed = (s.get("speedup") or {}).get("trained") or {}
        sets[name] = {"trained_al": trained.get("acceptance_length"), "per_position": trained.get("per_position"),
                      "control_al": control.get("acceptance_length") if control else None,
                      "margin_over_control": s["margin_over_control"], "speedup": speed, "count": s["count"]}
        line = (f"{name} ({s['count']} prompts, digest {s['rendered_digest'][:12]}): AL of the trained draft "
                f"{trained.get('acceptance_length')}, per position "
                f"{', '.join(str(x) for x in trained.get('per_position') or []) or '-'}")
        if control:
            line += f"; control {control.get('acceptance_length')} (margin {s['margin_over_control']:+.4f})"
        line += ("; speed-up " + ", ".join(f"{x}x at concurrency {c}" for c, x in speed.items())
                 if speed else "; no baseline measured")
        lines.append(line)
    up = evaluate_upgrade.describe(res.get("upgrade"))
    if up:
        lines.append(up)
    lines.append(f"gate: {res['gate'] if res.get('gate') else failure or 'off'}")
    lines.append(f"report: {report_path}")
    return {"changed": changed, "skipped": not changed, "report": str(report_path), "sets": sets,
            "vllm": res["vllm"], "gate": res.get("gate", ""), "gate_failed": bool(failure), "lines": lines}


def settings_line(res):
    s = res["settings"]
    return (f"{res['engine']['name']} {res['vllm']}, {s['num_speculative_tokens']} draft tokens, temperature "
            f"{s['temperature']}, top-p {s['top_p']}, chat mode {s['chat_mode'] or 'template default'}, at most "
            f"{s['max_tokens']} output tokens ({'EOS ignored' if s['ignore_eos'] else 'stop at EOS'}), concurrency "
            f"{', '.join(map(str, s['concurrency']))}; {res['al_formula']}")
