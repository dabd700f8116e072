"""Helpers the current track's steps share: the stack record, step directories, the datasets folder, the disk check."""

import shutil

from specdec_pipeline import manifest, versions
from specdec_pipeline.config import run_path, step_config
from specdec_pipeline.fsutil import check_space, plan_step_dir, read_json, sha256_json, write_json
from specdec_pipeline.tracks.current import extract_bytes_per_token


def stack_versions():
    """The current track's stack as installed: {distribution: version} (vLLM under its build's distribution name)."""
    found = versions.vllm()
    out = {found[0]: found[1]} if found else {}
    for dist in ("speculators", "hs-connectors", "torch", "transformers"):
        if versions.version(dist):
            out[dist] = versions.version(dist)
    return out


def _write_manifest(cfg, step, outputs, counts, started):
    return manifest.write(cfg, step, outputs, counts, started, extra={"track": "current", "stack": stack_versions()})


def disk_preflight(cfg, out_dir, n_tokens, n_layers, hidden, detail="", reclaim=0):
    """Fail before anything is written when the filesystem of OUT_DIR cannot hold the remaining hidden states."""
    storage = cfg["current"]["hs_storage"]
    per_token = extract_bytes_per_token(cfg, n_layers, hidden)
    need = int(n_tokens * per_token * float(cfg["extract"]["disk_margin"]))
    check_space("extract", out_dir, need,
                f"the hidden states of the remaining samples: {n_tokens} tokens x {per_token} B/token as {storage}, "
                f"margin {cfg['extract']['disk_margin']}{detail}",
                "use eagle3_pipeline_hs_storage: fp8, point eagle3_pipeline_work_dir at a larger filesystem or "
                "lower eagle3_pipeline_max_samples", reclaim=reclaim)
    return per_token


def _step_dir(cfg, step):
    """(work, discard, identity) of STEP, reading only: its directory when it resumes there (same config and
    inputs), else <step>.new, where the changed step is built while the finished output stays untouched until
    the new one is complete (fsutil.plan_step_dir; swap_in at the end)."""
    identity = {"config": sha256_json(step_config(cfg, step)), "inputs": manifest.input_digests(cfg, step)}
    work, discard = plan_step_dir(run_path(cfg, step), identity,
                                  fix=f"delete it (the {step} step then starts over there)")
    return work, discard, identity


def _inputs_settled(cfg, step):
    """True when every step STEP reads has a manifest made with today's settings: what it left is what STEP will
    read (so the disk-space check can run before the run writes anything)."""
    for dep in manifest.INPUTS[step]:
        man = manifest.read(cfg, dep)
        if man is None or man.get("config_hash") != sha256_json(step_config(cfg, dep)):
            return False
    return True


def write_dataset(samples, dest):
    """The prepared samples as a datasets folder (input_ids, loss_mask, seq_len; torch format), row i = hs_<i>."""
    import datasets  # noqa: PLC0415

    if read_json(dest / "specdec.json") == {"samples": len(samples)} and (dest / "dataset_info.json").exists():
        return
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    ds = datasets.Dataset.from_dict({"input_ids": [s["input_ids"] for s in samples],
                                     "loss_mask": [s["loss_mask"] for s in samples],
                                     "seq_len": [len(s["input_ids"]) for s in samples]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(tmp))
    write_json(tmp / "specdec.json", {"samples": len(samples)})
    tmp.rename(dest)


def _dataset_outputs(cfg, dest):
    return manifest.describe_outputs(cfg, [p for p in dest.rglob("*") if p.is_file()])
