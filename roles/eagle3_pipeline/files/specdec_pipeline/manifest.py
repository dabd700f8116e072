"""Step manifests: inputs, config hash, versions, counts and sha256 of outputs.

A step is skipped when its manifest exists, its config hash and input digests are unchanged, and
its outputs are still there with the recorded size (and, below HASH_LIMIT, the recorded sha256).
"""

import platform
import time
from pathlib import Path

from specdec_pipeline import algorithms, remote_code
from specdec_pipeline import versions as installed
from specdec_pipeline.config import run_path, step_config
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import plan_step_dir, read_json, sha256_file, sha256_json, write_json

HASH_LIMIT = 64 << 20
PREVIOUS = {"regenerate": None, "prepare": "regenerate", "extract": "prepare", "vocab": "prepare", "train": "vocab",
            "export": "train"}
# Steps whose outputs a step reads (its inputs): a changed upstream output re-runs it.
INPUTS = {"regenerate": [], "prepare": ["regenerate"], "extract": ["prepare"], "vocab": ["prepare"],
          "train": ["extract", "vocab"],
          "export": ["train", "vocab"]}
# Steps that run the target's tokenizer or model on data: their manifests record the target's own code that ran
# (remote_code.record) and a changed file re-runs them; later steps follow through their inputs.
REMOTE_CODE_STEPS = ("prepare", "extract")
# Inputs read only while their step is switched on: off, a step's manifest does not depend on them (a run made
# before the step existed stays current).
SWITCHED = {"regenerate": lambda cfg: bool(cfg["regenerate"]["enabled"])}


def inputs(step):
    """The steps whose outputs STEP reads: INPUTS, and for another algorithm's steps (algorithms.py) those of
    EAGLE-3's - train-<algo> reads the one extraction and the vocab mapping, export-<algo> its own training."""
    base, algo = algorithms.split(step)
    if algo in (None, "eagle3"):
        return INPUTS[step]
    return [algorithms.step_name(dep, algo) if dep in algorithms.TRAIN_STEPS else dep for dep in INPUTS[base]]


def manifest_path(cfg, step):
    return run_path(cfg, "manifests", f"{step}.json")


def versions():
    out = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "speculators", "datasets", "safetensors"):
        out[dist] = installed.version(dist)
    found = installed.vllm()  # its CPU builds are other distributions of the same package
    out["vllm_distribution"], out["vllm"] = found or (None, None)
    return out


def read(cfg, step):
    """The manifest of STEP, None when there is none; a damaged one is one PipelineError naming the file."""
    path = manifest_path(cfg, step)
    fix = f"delete {path} and re-run (the {step} step then checks its outputs and runs again where needed)"
    man = read_json(path, fix=fix)
    if man is not None and not (isinstance(man, dict) and isinstance(man.get("outputs"), dict)
                                and all(isinstance(m, dict) and {"size", "sha256"} <= set(m)
                                        for m in man["outputs"].values())):
        raise PipelineError(f"{path}: not a {step} manifest (no outputs with size and sha256); {fix}.")
    return man


def outputs_digest(manifest):
    return sha256_json(manifest["outputs"]) if manifest else None


def input_digests(cfg, step):
    return {dep: outputs_digest(read(cfg, dep)) for dep in inputs(step) if dep not in SWITCHED or SWITCHED[dep](cfg)}


def config_hash(cfg, step):
    """The digest of the settings STEP's hash covers on CFG's track (config.step_config)."""
    return sha256_json(step_config(cfg, step))


def identity(cfg, step):
    """What a build of STEP is made from: its config hash and its inputs' digests (recorded in its directory, so
    that a run resumes only a build of the same identity)."""
    return {"config": config_hash(cfg, step), "inputs": input_digests(cfg, step)}


def plan_dir(cfg, step, ident=None, **how):
    """(work, discard, identity) of STEP, reading only: fsutil.plan_step_dir of its run directory for IDENT (by
    default identity(cfg, step)); HOW: plan_step_dir's state_name, resume and fix (default: delete the directory
    named and the step starts over there)."""
    ident = identity(cfg, step) if ident is None else ident
    how.setdefault("fix", f"delete it (the {step} step then starts over there)")
    work, discard = plan_step_dir(run_path(cfg, step), ident, **how)
    return work, discard, ident


def describe_outputs(cfg, paths):
    run_dir = Path(cfg["run_dir"])
    out = {}
    for p in sorted(Path(x) for x in paths):
        out[str(p.relative_to(run_dir))] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return out


def is_current(cfg, step):
    """Return (True, '') when STEP can be skipped, else (False, reason)."""
    man = read(cfg, step)
    if man is None:
        return False, "no manifest"
    if man.get("config_hash") != config_hash(cfg, step):
        return False, "config changed"
    if man.get("inputs") != input_digests(cfg, step):
        return False, "inputs changed"
    if step in REMOTE_CODE_STEPS and "remote_code" in man:  # manifests of earlier releases lack it: add_remote_code
        why = remote_code.changes(man["remote_code"], remote_code.record(cfg))
        if why:
            return False, why
    run_dir = Path(cfg["run_dir"])
    for rel, meta in man["outputs"].items():
        p = run_dir / rel
        if not p.exists() or p.stat().st_size != meta["size"]:
            return False, f"output {rel} missing or changed"
        if meta["size"] <= HASH_LIMIT and sha256_file(p) != meta["sha256"]:
            return False, f"output {rel} changed"
    return True, ""


def write(cfg, step, outputs, counts, started, extra=None):
    man = {
        "step": step,
        "config": step_config(cfg, step),
        "config_hash": config_hash(cfg, step),
        "inputs": input_digests(cfg, step),
        "versions": versions(),
        "counts": counts,
        "outputs": outputs if isinstance(outputs, dict) else describe_outputs(cfg, outputs),
        "started": started,
        "finished": time.time(),
        "seconds": round(time.time() - started, 3),
    }
    if step in REMOTE_CODE_STEPS:
        man["remote_code"] = remote_code.record(cfg)
    if extra:
        man.update(extra)
    write_json(manifest_path(cfg, step), man)
    return man


def add_remote_code(cfg, step):
    """Record the target's own code in a current manifest written before manifests recorded it (the code that
    ran then is not known; what is there now is recorded, so a later change is noticed)."""
    man = read(cfg, step)
    if step in REMOTE_CODE_STEPS and man is not None and "remote_code" not in man:
        man["remote_code"] = remote_code.record(cfg)
        write_json(manifest_path(cfg, step), man)
