"""Step 6 - evaluate: serve the target with the exported draft in vLLM and measure what the draft is worth.

    python -m specdec_pipeline.evaluate EVAL_CONFIG.json run|status

Runs in the evaluation venv (a vLLM new enough to serve the draft), not in the pipeline venv. For each
variant - `baseline` (no draft), `trained` (the exported draft) and, optionally, `control` (a random-weight
draft of the same shape) - it starts vLLM's OpenAI server on 127.0.0.1 (serve.VllmServer: a free port, a random
API key, readiness only when the listening socket is the server's own, timeout, always stopped), sends the same
prompts (greedy unless a temperature is set; a fixed number of output tokens), and reads the spec-decode
counters from /metrics before and after: acceptance length
(AL = 1 + accepted / drafts), per-position acceptance, output tokens/s and the speed-up over the baseline.
The server's finished-request counter must grow by exactly the number of prompts sent, and the server must
still own its port after the measurement; otherwise the variant fails in one line.

Prompts: the held-out conversations prepare wrote (prepare/heldout.jsonl, never trained on) and/or a local
JSONL of {"prompt": text} | {"prompt_ids": [...]} | {"messages": [...]} records. Results go to
evaluate/results.json; a manifest (settings, export and prompt digests, vLLM version) makes a re-run with
nothing changed skip the measurement. The gate (min AL, or "the trained draft beats the control") is
checked on every run, also when the measurement was skipped. Exit status: 0 ok, 2 bad input or a failed
server, 4 gate failed (one line on stderr naming AL, the gate and the report).

This module holds the stage's configuration and its order; the parts are evaluate_prompts (prompts),
evaluate_measure (the servers and the counters), evaluate_record (fingerprint, gate, results, manifest) and
report_evaluate (the report's evaluation section).
"""

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from specdec_pipeline import report_evaluate
from specdec_pipeline.config import read_config_file
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.evaluate_measure import build_control_draft, measure
from specdec_pipeline.evaluate_prompts import load_prompts
from specdec_pipeline.evaluate_record import fingerprint, gate, is_current, record, results, results_file
from specdec_pipeline.fsutil import read_json, write_json
from specdec_pipeline.serve import owned_arg

DEFAULTS = {
    "run_dir": None,             # the pipeline run: reads export/, prepare/heldout.jsonl, manifests/
    "target": None,              # the target model directory vLLM serves
    "export_dir": None,          # default <run_dir>/export
    "python": sys.executable,    # the evaluation venv's interpreter (vLLM)
    "host": "127.0.0.1",
    "port": 0,                   # 0: a free port is picked for each server
    "server_args": [],           # extra vLLM arguments (e.g. --tensor-parallel-size 8 --trust-remote-code)
    "server_env": {},
    "ready_timeout_s": 900,
    "num_speculative_tokens": 3,
    "prompts": {"heldout": True, "jsonl": "", "max_prompts": 16},
    "max_tokens": 64,
    "temperature": 0.0,
    "ignore_eos": True,
    "concurrency": 1,
    "warmup_requests": 1,
    "request_timeout_s": 600,
    "baseline": True,
    "control": False,            # also measure a random-weight draft of the same shape (CPU profiles)
    "seed": 0,
    "min_acceptance_length": None,    # gate: fail below this AL of the trained draft (None: off)
    "require_beats_control": False,   # gate: fail unless the trained draft's AL beats the control's
}


# -- configuration ------------------------------------------------------------------------------------------
def load_config(path):
    path = Path(path)
    raw = read_config_file(path, "evaluation config not found; render it with the eagle3_evaluate role.")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise PipelineError(f"{path}: unknown key(s) {unknown}; expected some of {sorted(DEFAULTS)}.")
    cfg = {**DEFAULTS, **raw}
    cfg["prompts"] = {**DEFAULTS["prompts"], **(raw.get("prompts") or {})}
    for key in ("run_dir", "target"):
        if not cfg[key]:
            raise PipelineError(f"{path}: {key} is required.")
    cfg["export_dir"] = cfg["export_dir"] or str(Path(cfg["run_dir"]) / "export")
    checks = [("num_speculative_tokens", int, 1), ("max_tokens", int, 1), ("concurrency", int, 1),
              ("port", int, 0), ("warmup_requests", int, 0)]
    for key, kind, low in checks:
        if not isinstance(cfg[key], kind) or cfg[key] < low:
            raise PipelineError(f"{path}: {key} is {cfg[key]!r}; expected a whole number >= {low}.")
    if cfg["host"] != "127.0.0.1":
        raise PipelineError(f"{path}: host is {cfg['host']!r}; expected '127.0.0.1' (the evaluation server must not be "
                            "reachable from other machines).")
    if not isinstance(cfg["server_args"], list):
        raise PipelineError(f"{path}: server_args is {cfg['server_args']!r}; expected a list of strings "
                            "(eagle3_evaluate_server_args).")
    owned = owned_arg(cfg["server_args"])
    if owned:
        raise PipelineError(f"{path}: server_args (eagle3_evaluate_server_args) contains {owned!r}; the stage sets the "
                            "server's host (127.0.0.1), port and API key itself - remove it (eagle3_evaluate_port "
                            "chooses a fixed port).")
    if not isinstance(cfg["temperature"], (int, float)) or cfg["temperature"] < 0:
        raise PipelineError(f"{path}: temperature is {cfg['temperature']!r}; expected a number >= 0 (0 = greedy).")
    gate = cfg["min_acceptance_length"]
    if gate is not None and (not isinstance(gate, (int, float)) or not 1 <= gate <= 1 + cfg["num_speculative_tokens"]):
        raise PipelineError(f"{path}: min_acceptance_length is {gate!r}; expected null (off) or a number between 1 and "
                            f"1 + num_speculative_tokens = {1 + cfg['num_speculative_tokens']}.")
    if cfg["require_beats_control"] and not cfg["control"]:
        raise PipelineError(f"{path}: require_beats_control is true but control is false; enable the control "
                            "draft or drop that gate.")
    if not cfg["prompts"]["heldout"] and not cfg["prompts"]["jsonl"]:
        raise PipelineError(f"{path}: no prompts: set prompts.heldout true and/or prompts.jsonl to a local file.")
    cfg["_path"] = str(path)
    return cfg


def out_path(cfg, *parts):
    return Path(cfg["run_dir"]).joinpath("evaluate", *parts)


# -- the stage ----------------------------------------------------------------------------------------------
def run(cfg):
    prompts = load_prompts(cfg)
    fp = fingerprint(cfg, prompts)
    for name, digest in fp.get("remote_code", {}).items():
        print(f"evaluate: remote code: {cfg['target']}/{name} runs in vLLM (--trust-remote-code), sha256 {digest}",
              file=sys.stderr, flush=True)
    current, why = is_current(cfg, fp)
    report_dir = Path(cfg["run_dir"]) / "report"
    if current:
        res = read_json(results_file(cfg))
        print("evaluate: up to date (export, prompts and settings unchanged) - skipped", file=sys.stderr)
        changed = False
    else:
        print(f"evaluate: measuring ({why})", file=sys.stderr, flush=True)
        started = time.time()
        out_path(cfg).mkdir(parents=True, exist_ok=True)
        variants = {"trained": measure(cfg, "trained", Path(cfg["export_dir"]), prompts)}
        if cfg["baseline"]:
            variants["baseline"] = measure(cfg, "baseline", None, prompts)
        if cfg["control"]:
            control_dir = build_control_draft(cfg["export_dir"], out_path(cfg, "control-draft"), cfg["seed"])
            variants["control"] = measure(cfg, "control", control_dir, prompts)
        res = results(cfg, variants, prompts, fp, started)
        res["plot"] = report_evaluate.plot(res, report_dir)
        changed = True
    failure = gate(cfg, res, report_dir / "report.md")
    res["plot"] = res.get("plot") or report_evaluate.plot(res, report_dir)
    record(cfg, res, fp, failure)
    report_path = report_evaluate.write(cfg["run_dir"])
    v = res["variants"]
    summary = {"changed": changed, "skipped": not changed, "report": str(report_path),
               "trained_al": v["trained"]["acceptance_length"],
               "control_al": v["control"]["acceptance_length"] if "control" in v else None,
               "margin_over_control": res["margin_over_control"],
               "speedup": res["speedup"].get("trained"),
               "baseline_tokens_per_s": v["baseline"]["output_tokens_per_s"] if "baseline" in v else None,
               "trained_tokens_per_s": v["trained"]["output_tokens_per_s"],
               "per_position": v["trained"]["per_position"], "gate": res["gate"], "gate_failed": bool(failure)}
    return summary, failure


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specdec_pipeline.evaluate")
    parser.add_argument("config")
    parser.add_argument("command", choices=["run", "status"])
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.command == "status":
            current, why = is_current(cfg, fingerprint(cfg, load_prompts(cfg)))
            print(json.dumps({"evaluate": current, "why": why}))
            return 0
        summary, failure = run(cfg)
    except PipelineError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    write_json(Path(cfg["run_dir"]) / "evaluate" / "summary.json", summary)
    print(json.dumps(summary))
    if failure:
        print(f"ERROR: {failure}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
