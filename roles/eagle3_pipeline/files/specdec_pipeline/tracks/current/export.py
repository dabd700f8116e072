"""Step 5 on the current track - export: the chosen epoch's speculators-format checkpoint, checked, copied to export/.

The chosen epoch is the one the train manifest names (counts.validation.best_epoch: the highest validation acceptance
of the training's epochs, train_figures), or the last one where the manifest has no validation (a training recorded
before the pipeline chose); the export manifest records it, why, and its validation figures.

The same step exports each other draft algorithm of the run (export-<algo>, algorithms.py) from train-<algo>/ to
export-<algo>/, checked by its algorithm: its config as vLLM reads it (speculators_model_type, aux_hidden_state_layer_ids,
block_size, mask_token_id, the draft tokens per step) and the vocab step's mapping.
"""

import json
import shutil
import time

from specdec_pipeline import algorithms, manifest, vocab
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, read_json
from specdec_pipeline.progress import log
from specdec_pipeline.target import text_config
from specdec_pipeline.tracks.current.common import _write_manifest
from specdec_pipeline.tracks.current.train import epochs_done


def block_config_problem(conf, algo, aux_ids, block_size, non_causal, vocab_size):
    """'' when CONF (a DFlash-family draft's config.json) is what ALGO trained with these settings, else the problem:
    its type, the capture ids it asks the target for, its block, its mask token and the draft tokens per step."""
    want_tokens = algorithms.speculative_tokens(algo, block_size)
    methods = (conf.get("speculators_config") or {}).get("proposal_methods") or [{}]
    mask = conf.get("mask_token_id")
    for key, got, want in (("speculators_model_type", conf.get("speculators_model_type"), algo),
                           ("aux_hidden_state_layer_ids", conf.get("aux_hidden_state_layer_ids"), list(aux_ids)),
                           ("block_size", conf.get("block_size"), block_size),
                           ("sliding_window_non_causal", conf.get("sliding_window_non_causal"), non_causal),
                           ("speculators_config.proposal_methods[0].speculative_tokens",
                            methods[0].get("speculative_tokens"), want_tokens)):
        if got != want:
            return f"config.json: {key} is {got!r}, expected {want!r}"
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < vocab_size:
        return f"config.json: mask_token_id is {mask!r}, expected a token id of the target (0..{vocab_size - 1})"
    return ""


def as_vllm_reads(conf):
    """(the draft's model config, its speculative config) as the installed vLLM reads CONF (its speculators reader);
    None when this venv has no vLLM."""
    try:
        from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig  # noqa: PLC0415
    except ImportError:
        return None
    return (SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(conf))),
            SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(conf))))


def vllm_view_problem(conf, aux_ids, tokens, non_causal):
    """'' when the installed vLLM reads CONF (a DFlash-family config) as trained - the target layers it asks for,
    the draft tokens per step, causal or not - else the problem; '' as well when this venv has no vLLM."""
    try:
        seen = as_vllm_reads(conf)
    except (ValueError, KeyError, TypeError) as exc:
        return f"config.json: vLLM's speculators reader refuses it ({exc})"
    if seen is None:
        return ""
    model, spec = seen
    dflash = model.get("dflash_config") or {}
    for what, got, want in (("eagle_aux_hidden_state_layer_ids", model.get("eagle_aux_hidden_state_layer_ids"), list(aux_ids)),
                            ("num_speculative_tokens", spec.get("num_speculative_tokens"), tokens),
                            ("dflash_config.causal", dflash.get("causal", True), not non_causal)):
        if got != want:
            return f"config.json as vLLM reads it: {what} is {got!r}, expected {want!r}"
    return ""


def check_export(model_path, conf, aux_ids, d2t, t2d, block=None):
    """MODEL_PATH (the copied weights) and CONF against the run: EAGLE-3's aux ids, or for a DFlash-family draft
    block_config_problem with BLOCK (its other arguments); d2t/t2d equal the vocab step's (a draft of the target's
    whole vocabulary has none: the mapping would be the identity)."""
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    if block is None and list(conf.get("eagle_aux_hidden_state_layer_ids") or []) != list(aux_ids):
        raise ValueError(f"config.json: eagle_aux_hidden_state_layer_ids is {conf.get('eagle_aux_hidden_state_layer_ids')}, "
                         f"expected {aux_ids}")
    if block is not None:
        problem = block_config_problem(conf, aux_ids=aux_ids, **block)
        if problem:
            raise ValueError(problem)
    with safe_open(str(model_path), framework="pt") as f:
        keys = set(f.keys())
        if d2t.shape[0] == t2d.shape[0] and not {"d2t", "t2d"} & keys:
            return  # the whole vocabulary: speculators stores no mapping, and vLLM reads none (draft = target vocab)
        for name in ("d2t", "t2d"):
            if name not in keys:
                raise ValueError(f"{model_path}: no {name} tensor")
        if not torch.equal(f.get_tensor("d2t").to(d2t.dtype), d2t) or not torch.equal(f.get_tensor("t2d").to(t2d.dtype), t2d):
            raise ValueError(f"{model_path}: d2t/t2d differ from the vocab step's mapping")


def chosen_epoch(cfg, step, train, done):
    """(epoch, chosen_by, its validation figures or None) of TRAIN's checkpoints (DONE: their epochs) that STEP
    exports: the train manifest's best_epoch, else the last epoch."""
    path = manifest.manifest_path(cfg, train)
    val = ((manifest.read(cfg, train) or {}).get("counts") or {}).get("validation")
    if val is None:
        return done[-1], f"the last epoch ({done[-1]}): {path.name} records no validation (a training recorded " \
                         "before the pipeline chose the epoch)", None
    best = val.get("best_epoch") if isinstance(val, dict) else None
    if not isinstance(best, int) or isinstance(best, bool) or best not in done:
        raise PipelineError(f"{step}: {path}: counts.validation.best_epoch is {best!r}, expected one of the epochs "
                            f"with a checkpoint under {run_path(cfg, train, 'checkpoints')} ({done}); delete {path} "
                            f"and re-run (the {train} step then runs again and records the choice).")
    figures = (val.get("per_epoch") or {}).get(str(best))
    return best, str(val.get("chosen_by") or ""), figures if isinstance(figures, dict) else None


def run(cfg, algo="eagle3"):
    started = time.time()
    step, train = algorithms.step_name("export", algo), algorithms.step_name("train", algo)
    done = epochs_done(run_path(cfg, train, "checkpoints"))
    if not done:
        raise PipelineError(f"{step}: no checkpoint under {train}/checkpoints; run the {train} step first.")
    epoch, chosen_by, figures = chosen_epoch(cfg, step, train, done)
    src = run_path(cfg, train, "checkpoints", str(epoch))
    log.info("%s: epoch %s (%s)", step, epoch, chosen_by)
    ids = read_json(run_path(cfg, "extract", "data_config.json"))["layer_ids"]
    aux = ids[:-1]  # vLLM capture ids are what the served draft asks the target for
    conf = json.loads((src / "config.json").read_text())
    conf.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(cfg["target"]["path"])
    d2t, t2d = vocab.load(cfg)
    block = None
    if algo != "eagle3":
        block = {"algo": algo, "block_size": cfg["dflash"]["block_size"], "non_causal": cfg["dflash"]["non_causal"],
                 "vocab_size": int(text_config(cfg).vocab_size)}
        log.info("%s: checking %s, also as the installed vLLM reads it (its speculators reader)", step, src / "config.json")
        problem = block_config_problem(conf, aux_ids=aux, **block) or vllm_view_problem(
            conf, aux, algorithms.speculative_tokens(algo, block["block_size"]), block["non_causal"])
        if problem:  # before anything is written
            raise PipelineError(f"{step}: {src}/{problem}; delete {run_path(cfg, train)} "
                                f"and re-run (the {train} step then trains again).")
    out = run_path(cfg, step)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors",
                     validate=lambda p: check_export(p, conf, aux, d2t, t2d, block)) as tmp:
        shutil.copyfile(src / "model.safetensors", tmp)
    with atomic_path(out / "config.json", validate=lambda p: json.loads(p.read_text())) as tmp:
        tmp.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copyfile(src / extra, out / extra)
    chosen = {"epoch": epoch, "chosen_by": chosen_by, "validation": figures}
    if algo == "eagle3":
        counts = {**chosen, "capture_layer_ids": ids, "eagle_aux_hidden_state_layer_ids": aux,
                  "norm_before_fc": conf.get("norm_before_fc"), "norm_output": conf.get("norm_output")}
    else:
        counts = {**chosen, "capture_layer_ids": ids, "algorithm": algo, "aux_hidden_state_layer_ids": aux,
                  "block_size": conf["block_size"], "mask_token_id": conf["mask_token_id"],
                  "speculative_tokens": algorithms.speculative_tokens(algo, conf["block_size"]),
                  "non_causal": conf["sliding_window_non_causal"]}
    return _write_manifest(cfg, step, [out / "config.json", out / "model.safetensors"], counts, started)
