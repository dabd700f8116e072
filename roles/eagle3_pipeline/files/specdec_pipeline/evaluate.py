"""Step 6 - evaluate: serve the target with the exported draft in vLLM and measure what the draft is worth.

    python -m specdec_pipeline.evaluate EVAL_CONFIG.json run|status

Runs in the evaluation venv (a vLLM new enough to serve the draft), not in the pipeline venv. For each
variant - `baseline` (no draft), `trained` (the exported EAGLE-3 draft), each other draft the run trained (`dflash`,
`dspark`: evaluate_drafts.py, served with the method its export names), `ngram` (vLLM's prompt-lookup speculation,
which needs no training: what a user would try first, so every draft is reported against it) and, optionally, each
draft's `control` (a random-weight draft of the same shape) - it starts vLLM's OpenAI server on 127.0.0.1 (serve.VllmServer: a free port, a random
API key, readiness only when the listening socket is the server's own, timeout, always stopped) and sends every
named prompt set (prompt_sets.py: heldout, humaneval, jsonl) at every concurrency level, the same requests to each
variant: messages rendered in the run's chat mode by the target's own template, greedy unless a temperature is
set, stopping at end-of-sequence unless ignore_eos, at most max_tokens output tokens. The spec-decode counters from
/metrics before and after each batch give the acceptance length (AL = 1 + accepted / drafts, the bonus token
counted) and the per-position acceptance per prompt set; output tokens/s with and without the draft give the
speed-up per concurrency. The server's finished-request counter must grow by exactly the number of requests sent,
and the server must still own its port after the measurement; otherwise the variant fails in one line.

Results go to evaluate/results.json with every setting that moves AL (engine and version, draft tokens,
temperature and top-p, chat mode, prompt sets with their digests, the AL formula, concurrency); a manifest
(settings, export and prompt digests, vLLM version) makes a re-run with nothing changed skip the measurement.
When only the vLLM changed since the last measurement, the same prompts and settings are measured again and the
per-position acceptance is compared with the last recorded run (evaluate_upgrade.py: history per vLLM version).
The gates (min AL per prompt set, "the trained draft beats the control", a speed-up at a named concurrency, the
served acceptance near what training validated (evaluate_consistency.py), no
acceptance drop after a vLLM change) are checked on every run, also when the measurement was skipped. Exit
status: 0 ok, 2 bad input or a failed server, 4 gate failed (one line on stderr naming the figure, the gate and
the report).

The target's own code (its auto_map's *.py files) runs only with the stage's own switch, trust_remote_code
(eagle3_evaluate_trust_remote_code; never the pipeline's): then in this process (the tokenizer that renders the
prompts) and in vLLM (--trust-remote-code, added here); those files are named with their sha256 before anything
loads the target. The process runs with HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 (remote_code.OFFLINE_ENV),
as every server it starts: nothing of the target comes from the network.

This module holds the stage's configuration and its order; the parts are prompt_sets (prompts), evaluate_measure
(the servers and the counters), evaluate_record (fingerprint, gates, results, manifest), evaluate_upgrade (history
and the comparison after a vLLM change) and report_evaluate (the report's evaluation section).
"""

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from specdec_pipeline import chatmode, evaluate_drafts, evaluate_upgrade, prompt_sets, remote_code, report_evaluate
from specdec_pipeline.config import read_config_file
from specdec_pipeline.errors import PipelineError, unexpected_error_line
from specdec_pipeline.evaluate_measure import NGRAM, build_control_draft, measure, requests_per_variant
from specdec_pipeline.evaluate_record import (
    SWITCH,
    fingerprint,
    gate,
    is_current,
    record,
    results,
    results_file,
    summary,
    vllm_version,
)
from specdec_pipeline.fsutil import read_json, write_json
from specdec_pipeline.progress import Progress
from specdec_pipeline.server_args import TRUST_ARG, owned_arg

DEFAULTS = {
    "run_dir": None,             # the pipeline run: reads export/, prepare/heldout.jsonl, manifests/
    "target": None,              # the target model directory vLLM serves
    "trust_remote_code": False,  # this stage's switch: the target's own code runs (tokenizer here, vLLM)
    "chat_mode": None,           # the run's chat mode (thinking | instant); None: the template's own default
    "export_dir": None,          # default <run_dir>/export
    "python": sys.executable,    # the evaluation venv's interpreter (vLLM)
    "host": "127.0.0.1",
    "port": 0,                   # 0: a free port is picked for each server
    "server_args": [],           # extra vLLM arguments (e.g. --tensor-parallel-size 8)
    "server_env": {},
    "ready_timeout_s": 900,
    "num_speculative_tokens": 3,    # the EAGLE-3 draft's
    "drafts": ["eagle3"],          # the run's draft algorithms (its configuration's drafts), measured side by side
    "draft_tokens": {},            # {algorithm: draft tokens per step} of the other drafts; unset: what the block trained
    "prompt_sets": ["heldout"],  # named sets (prompt_sets.PROMPT_SETS), each measured and reported on its own
    "prompts_jsonl": "",         # the local file of the jsonl set
    "max_prompts": 0,            # per set; 0: all
    "max_tokens": 256,           # output cap per request
    "ignore_eos": False,         # true: every request generates exactly max_tokens
    "temperature": 0.0,
    "top_p": 1.0,
    "concurrency": [1],          # requests in flight at once; each level measured
    "warmup_requests": 1,
    "request_timeout_s": 600,
    "baseline": True,
    "control": False,            # also measure a random-weight draft of the same shape (CPU profiles)
    "ngram": True,               # also measure vLLM's n-gram (prompt-lookup) speculation: the free alternative
    "ngram_lookup_min": 2,       # its shortest and longest n-gram matched against the prompt and the output so far
    "ngram_lookup_max": 4,
    "seed": 0,
    "min_acceptance_length": None,    # gate: fail when a set's AL of the trained draft is below this (None: off)
    "require_beats_control": False,   # gate: fail unless the trained draft's AL beats the control's on every set
    "min_speedup": None,              # gate: fail when the speed-up at speedup_concurrency is below this (None: off)
    "speedup_concurrency": 1,
    "upgrade_tolerance": 0.05,        # gate: the largest drop of a position's acceptance after a vLLM change (None: off)
    "consistency_min_ratio": 0.5,     # gate: served AL gain at least this share of the validated one (None: off)
}
WHOLE = {"num_speculative_tokens": 1, "max_tokens": 1, "port": 0, "warmup_requests": 0, "max_prompts": 0,
         "speedup_concurrency": 1, "ready_timeout_s": 1, "request_timeout_s": 1, "ngram_lookup_min": 1,
         "ngram_lookup_max": 1}
VARS = {"concurrency": "eagle3_evaluate_concurrency", "prompt_sets": "eagle3_evaluate_prompt_sets",
        "min_speedup": "eagle3_evaluate_min_speedup", "upgrade_tolerance": "eagle3_evaluate_upgrade_tolerance",
        "top_p": "eagle3_evaluate_top_p", "temperature": "eagle3_evaluate_temperature"}


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- configuration ------------------------------------------------------------------------------------------
def load_config(path):
    """The evaluation configuration, every setting checked (one PipelineError line naming the key, the value,
    what was expected and the role variable); nothing is started or written before."""
    path = Path(path)
    raw = read_config_file(path, "evaluation config not found; render it with the eagle3_evaluate role.")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise PipelineError(f"{path}: unknown key(s) {unknown}; expected some of {sorted(DEFAULTS)}.")
    cfg = {**DEFAULTS, **raw}

    def bad(key, expected):
        var = VARS.get(key, f"eagle3_evaluate_{key}")
        return PipelineError(f"{path}: {key} is {cfg[key]!r}; expected {expected} ({var}).")

    for key in ("run_dir", "target"):
        if not cfg[key]:
            raise PipelineError(f"{path}: {key} is required.")
    cfg["export_dir"] = cfg["export_dir"] or str(Path(cfg["run_dir"]) / "export")
    for key, low in WHOLE.items():
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < low:
            raise bad(key, f"a whole number >= {low}")
    levels = cfg["concurrency"]
    if isinstance(levels, int) and not isinstance(levels, bool):
        levels = cfg["concurrency"] = [levels]
    if (not isinstance(levels, list) or not levels
            or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in levels) or len(set(levels)) != len(levels)):
        raise bad("concurrency", "a list of distinct whole numbers >= 1, e.g. [1, 8, 32]")
    sets = cfg["prompt_sets"]
    if not isinstance(sets, list) or not sets or len(set(map(str, sets))) != len(sets):
        raise bad("prompt_sets", f"a non-empty list of distinct names from {list(prompt_sets.PROMPT_SETS)}")
    for name in sets:
        if name not in prompt_sets.PROMPT_SETS:
            raise PipelineError(f"{path}: prompt set {name!r} in prompt_sets; expected names from "
                                f"{list(prompt_sets.PROMPT_SETS)} (eagle3_evaluate_prompt_sets).")
    if cfg["prompts_jsonl"] and "jsonl" not in sets:
        raise PipelineError(f"{path}: prompts_jsonl is {cfg['prompts_jsonl']!r} but 'jsonl' is not in prompt_sets "
                            f"{sets}; add jsonl to eagle3_evaluate_prompt_sets or clear eagle3_evaluate_prompts_jsonl.")
    if cfg["chat_mode"] is not None and cfg["chat_mode"] not in chatmode.MODES:
        raise PipelineError(f"{path}: chat_mode is {cfg['chat_mode']!r}; expected one of {list(chatmode.MODES)} "
                            "(the pipeline's eagle3_pipeline_chat_mode).")
    if cfg["host"] != "127.0.0.1":
        raise PipelineError(f"{path}: host is {cfg['host']!r}; expected '127.0.0.1' (the evaluation server must not be "
                            "reachable from other machines).")
    if not isinstance(cfg["server_args"], list):
        raise bad("server_args", "a list of strings")
    for key in ("trust_remote_code", "ngram"):
        if not isinstance(cfg[key], bool):
            raise bad(key, "true or false")
    if cfg["ngram_lookup_min"] > cfg["ngram_lookup_max"]:
        raise bad("ngram_lookup_min", f"at most ngram_lookup_max ({cfg['ngram_lookup_max']}): the shortest n-gram "
                                      "looked up cannot be longer than the longest")
    problem = evaluate_drafts.config_problem(cfg)
    if problem:
        raise PipelineError(f"{path}: {problem}")
    trust_arg = owned_arg(cfg["server_args"], (TRUST_ARG,))
    if trust_arg and not cfg["trust_remote_code"]:
        raise PipelineError(f"{path}: server_args (eagle3_evaluate_server_args) contains {trust_arg!r} while "
                            f"trust_remote_code is false; the stage's switch {SWITCH} decides whether the target's "
                            f"own code runs - remove it, or set {SWITCH}: true.")
    owned = owned_arg(cfg["server_args"])
    if owned:
        raise PipelineError(f"{path}: server_args (eagle3_evaluate_server_args) contains {owned!r}; the stage sets the "
                            "server's host (127.0.0.1), port and API key itself - remove it (eagle3_evaluate_port "
                            "chooses a fixed port).")
    if not _number(cfg["temperature"]) or cfg["temperature"] < 0:
        raise bad("temperature", "a number >= 0 (0 = greedy)")
    if not _number(cfg["top_p"]) or not 0 < cfg["top_p"] <= 1:
        raise bad("top_p", "a number in (0, 1]")
    top = 1 + cfg["num_speculative_tokens"]  # the other drafts' tops are known once their exports are read
    if cfg["min_acceptance_length"] is not None and (not _number(cfg["min_acceptance_length"])
                                                     or not 1 <= cfg["min_acceptance_length"]
                                                     or ("eagle3" in cfg["drafts"] and cfg["min_acceptance_length"] > top)):
        raise bad("min_acceptance_length", f"null (off) or a number between 1 and 1 + num_speculative_tokens = {top}")
    if cfg["min_speedup"] is not None:
        if not _number(cfg["min_speedup"]) or cfg["min_speedup"] <= 0:
            raise bad("min_speedup", "null (off) or a number > 0 (1.2 = 20 % faster than without the draft)")
        if not cfg["baseline"]:
            raise PipelineError(f"{path}: min_speedup is {cfg['min_speedup']} but baseline is false; the speed-up needs "
                                "the target measured without a draft (eagle3_evaluate_baseline: true).")
        if cfg["speedup_concurrency"] not in levels:
            raise bad("speedup_concurrency", f"one of the measured concurrency levels {levels} "
                                             "(eagle3_evaluate_concurrency)")
    if cfg["upgrade_tolerance"] is not None and (not _number(cfg["upgrade_tolerance"])
                                                 or not 0 <= cfg["upgrade_tolerance"] <= 1):
        raise bad("upgrade_tolerance", "null (off) or a number between 0 and 1 (a drop of a position's acceptance rate)")
    if cfg["consistency_min_ratio"] is not None and (not _number(cfg["consistency_min_ratio"])
                                                     or not 0 < cfg["consistency_min_ratio"] <= 1):
        raise bad("consistency_min_ratio", "null (off) or a number in (0, 1] (the share of the validated AL gain the "
                                           "served draft must reach)")
    if cfg["require_beats_control"] and not cfg["control"]:
        raise PipelineError(f"{path}: require_beats_control is true but control is false; enable the control "
                            "draft or drop that gate.")
    cfg["_path"] = str(path)
    return cfg


def out_path(cfg, *parts):
    return Path(cfg["run_dir"]).joinpath("evaluate", *parts)


def load_sets(cfg):
    """Every prompt set, loaded and rendered as it will be sent: a bad, missing or empty set, or a chat mode the
    template cannot render, is one line here - before any server starts."""
    psets = [prompt_sets.load(name, cfg["run_dir"], cfg["max_prompts"], cfg["prompts_jsonl"])
             for name in cfg["prompt_sets"]]
    tok = None
    if prompt_sets.needs_tokenizer(psets):
        from specdec_pipeline.target import load_tokenizer  # noqa: PLC0415 - transformers only when needed

        tok = load_tokenizer({"target": {"path": cfg["target"], "trust_remote_code": cfg["trust_remote_code"],
                                         "switch": SWITCH}})
        if cfg["chat_mode"]:
            said = chatmode.problem(cfg["chat_mode"], tok, cfg["target"])
            if said:
                raise PipelineError(f"evaluate: {said}")
    context = server_context(cfg["server_args"])
    out = [prompt_sets.render(p, tok, cfg["chat_mode"], context, cfg["max_tokens"]) for p in psets]
    for p in out:
        if p["too_long"]:
            print(f"evaluate: prompt set {p['name']}: {len(p['too_long'])} prompts leave no room in --max-model-len "
                  f"{context} and are left out (e.g. {p['too_long'][0]}); {p['count']} are measured",
                  file=sys.stderr, flush=True)
    return out


def server_context(server_args):
    """The --max-model-len the servers get (None when not given: the model's own limit applies)."""
    args = [str(a) for a in server_args]
    for n, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--max-model-len=") else (
            args[n + 1] if arg == "--max-model-len" and n + 1 < len(args) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def announce(cfg):
    """Before anything loads the target: which of its *.py files run with this stage's switch (name and sha256, in
    this process and in vLLM), or that none does; an auto_map naming another repository is refused here."""
    lines, _files = remote_code.announcement(cfg["target"], cfg["trust_remote_code"], SWITCH)
    for line in lines:
        print(f"evaluate: {line}", file=sys.stderr, flush=True)


# -- the stage ----------------------------------------------------------------------------------------------
def run(cfg):
    announce(cfg)
    specs = evaluate_drafts.specs(cfg, lambda: vllm_version(cfg))  # what the vLLM cannot serve: refused before anything runs
    # A progress file of an earlier run must not speak for this one while the prompts load.
    if Path(cfg["run_dir"]).is_dir():
        out_path(cfg).mkdir(exist_ok=True)
        Progress(out_path(cfg, "progress.json"), "evaluate", 0, unit="requests").update(
            force=True, message="loading the prompt sets")
    psets = load_sets(cfg)
    fp = fingerprint(cfg, psets, specs)
    current, why = is_current(cfg, fp)
    report_dir = Path(cfg["run_dir"]) / "report"
    if current:
        res = read_json(results_file(cfg))
        print("evaluate: up to date (export, prompts and settings unchanged) - skipped", file=sys.stderr)
        Progress(out_path(cfg, "progress.json"), "evaluate (up to date)", 0, unit="requests").finish()
        changed = False
    else:
        print(f"evaluate: measuring ({why}); prompt sets "
              + ", ".join(f"{p['name']} ({p['count']})" for p in psets)
              + f"; concurrency {cfg['concurrency']}", file=sys.stderr, flush=True)
        started = time.time()
        out_path(cfg).mkdir(parents=True, exist_ok=True)
        # each draft and its control, the target alone, n-gram speculation
        n_variants = len(specs) * (1 + bool(cfg["control"])) + bool(cfg["baseline"]) + bool(cfg["ngram"])
        prog = Progress(out_path(cfg, "progress.json"), "evaluate", n_variants * requests_per_variant(cfg, psets),
                        unit="requests", interval=2.0)
        variants = {}
        for spec in specs:  # the drafts (EAGLE-3's first), then the target alone, then the controls
            variants[spec["variant"]] = measure(cfg, spec["variant"], Path(spec["export_dir"]), psets, prog,
                                                spec["method"], spec["num_speculative_tokens"])
        if cfg["baseline"]:
            variants["baseline"] = measure(cfg, "baseline", None, psets, prog)
        if cfg["ngram"]:  # prompt lookup: no draft model, the same draft tokens per step as EAGLE-3's
            variants[NGRAM] = measure(cfg, NGRAM, None, psets, prog, NGRAM, cfg["num_speculative_tokens"])
        for spec in specs if cfg["control"] else []:
            control_dir = build_control_draft(spec["export_dir"], out_path(cfg, spec["control"] + "-draft"), cfg["seed"])
            variants[spec["control"]] = measure(cfg, spec["control"], control_dir, psets, prog, spec["method"],
                                                spec["num_speculative_tokens"])
        prog.finish()
        res = results(cfg, variants, psets, fp, started, specs)
        res["upgrade"] = evaluate_upgrade.compare(cfg, res, fp)
        res["plot"] = report_evaluate.plot(res, report_dir)
        changed = True
    failure = gate(cfg, res, report_dir / "report.md")
    res["plot"] = res.get("plot") or report_evaluate.plot(res, report_dir)
    if changed:
        evaluate_upgrade.append(cfg, res, fp, evaluate_upgrade.failure(res["upgrade"], cfg["upgrade_tolerance"], "-"))
    res["history_plot"] = evaluate_upgrade.plot(cfg, report_dir)
    record(cfg, res, fp, failure)
    report_path = report_evaluate.write(cfg["run_dir"])
    return summary(res, changed, report_path, failure), failure


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specdec_pipeline.evaluate")
    parser.add_argument("config")
    parser.add_argument("command", choices=["run", "status"])
    args = parser.parse_args(argv)
    # Nothing of the target comes from the hub: this process's tokenizer and every server it starts are offline.
    os.environ.update(remote_code.OFFLINE_ENV)
    try:
        cfg = load_config(args.config)
        if args.command == "status":
            announce(cfg)
            specs = evaluate_drafts.specs(cfg, lambda: vllm_version(cfg))
            current, why = is_current(cfg, fingerprint(cfg, load_sets(cfg), specs))
            print(json.dumps({"evaluate": current, "why": why}))
            return 0
        result, failure = run(cfg)
    except PipelineError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug or an unforeseen failure: the traceback goes to logs/evaluate.log, one line here
        print(unexpected_error_line(exc, lambda: Path(cfg["run_dir"]) / "logs" / "evaluate.log"), file=sys.stderr)
        return 1
    write_json(Path(cfg["run_dir"]) / "evaluate" / "summary.json", result)
    print(json.dumps(result))
    if failure:
        print(f"ERROR: {failure}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
