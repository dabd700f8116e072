"""The evaluate stage's record: what a measurement depends on (its fingerprint), whether the last one is current,
the gate, and results.json plus the manifest that let a re-run with nothing changed skip the measurement."""

import time
from pathlib import Path

from specdec_pipeline import remote_code, versions
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import read_json, sha256_file, sha256_json, write_json

# Settings whose change re-measures (the gates are checked on every run and are not part of the hash).
MEASURE_KEYS = ("target", "server_args", "num_speculative_tokens", "prompts", "max_tokens", "temperature",
                "ignore_eos", "concurrency", "warmup_requests", "baseline", "control", "seed")


def vllm_version(cfg):
    """"<distribution> <version>" of the vLLM in the evaluation venv (versions.py, run by its Python)."""
    found = versions.vllm_of(cfg["python"])
    if not found:
        raise PipelineError(f"evaluate: {cfg['python']} has no vLLM installed; run the eagle3_evaluate role "
                            "(it creates the evaluation venv) or fix eagle3_evaluate_venv_path.")
    return found


def fingerprint(cfg, prompts):
    export = Path(cfg["export_dir"])
    for name in ("config.json", "model.safetensors"):
        if not (export / name).is_file():
            raise PipelineError(f"evaluate: {export / name} is missing; run the pipeline stage (export) first.")
    fp = {
        "settings": sha256_json({k: cfg[k] for k in MEASURE_KEYS}),
        "export": {n: sha256_file(export / n) for n in ("config.json", "model.safetensors")},
        "prompts": sha256_json(prompts),
        "vllm": vllm_version(cfg),
    }
    ran = remote_code_files(cfg)
    if ran:  # a changed file of the target's own code re-measures
        fp["remote_code"] = ran
    return fp


def remote_code_files(cfg):
    """{name: sha256} of the target's own *.py files vLLM runs: only with --trust-remote-code in server_args."""
    if "--trust-remote-code" not in [str(a) for a in cfg["server_args"]]:
        return {}
    return remote_code.files_that_run(str(cfg["target"]))


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


def gate(cfg, results, report_path):
    """Return '' when the gates pass, else the one failure line."""
    trained = results["variants"]["trained"]
    al = trained["acceptance_length"] or 1.0
    if cfg["min_acceptance_length"] is not None and al < float(cfg["min_acceptance_length"]):
        return (f"evaluate: acceptance length {al:.3f} of the trained draft is below min_acceptance_length "
                f"{float(cfg['min_acceptance_length']):g}; report: {report_path}")
    control = results["variants"].get("control")
    if cfg["require_beats_control"]:
        if not control:
            return "evaluate: require_beats_control is set but no control draft was measured; re-run with control on."
        c_al = control["acceptance_length"] or 1.0
        if al <= c_al:
            return (f"evaluate: the trained draft (AL {al:.3f}) does not beat the random-weight control draft "
                    f"(AL {c_al:.3f}); report: {report_path}")
    return ""


def gate_text(cfg):
    parts = []
    if cfg["min_acceptance_length"] is not None:
        parts.append(f"AL >= {float(cfg['min_acceptance_length']):g}")
    if cfg["require_beats_control"]:
        parts.append("trained AL > control AL")
    return ("passed (" + ", ".join(parts) + ")") if parts else "off"


def results(cfg, variants, prompts, fp, started):
    """results.json's content for freshly measured VARIANTS: speed-ups over the baseline, the margin over the
    control, the settings and the vLLM that measured (the gate line is filled in by record)."""
    base = variants.get("baseline")
    speedup = {k: round(r["output_tokens_per_s"] / base["output_tokens_per_s"], 3) if base else None
               for k, r in variants.items() if k != "baseline"}
    margin = (round((variants["trained"]["acceptance_length"] or 1) - (variants["control"]["acceptance_length"] or 1), 4)
              if "control" in variants else None)
    return {"variants": variants, "speedup": speedup, "margin_over_control": margin, "prompts": len(prompts),
            "settings": {k: cfg[k] for k in MEASURE_KEYS}, "vllm": fp["vllm"], "gate": "",
            "seconds": round(time.time() - started, 1)}


def record(cfg, res, fp, failure):
    """Write results.json (with the gate's line) and the manifest naming its sha256."""
    res["gate"] = failure or gate_text(cfg)
    write_json(results_file(cfg), res)
    write_json(manifest_file(cfg), {"step": "evaluate", "fingerprint": fp, "finished": time.time(),
                                    "results_sha256": sha256_file(results_file(cfg))})
    return res
