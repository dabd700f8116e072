"""Helpers the current track's steps share: the stack record, the manifests, the datasets folder."""

import shutil

from specdec_pipeline import manifest, versions
from specdec_pipeline.fsutil import read_json, write_json
from specdec_pipeline.tracks.current.rules import NAME


def stack_versions():
    """The current track's stack as installed: {distribution: version} (vLLM under its build's distribution name)."""
    found = versions.vllm()
    out = {found[0]: found[1]} if found else {}
    for dist in ("speculators", "hs-connectors", "torch", "transformers"):
        if versions.version(dist):
            out[dist] = versions.version(dist)
    return out


def _write_manifest(cfg, step, outputs, counts, started):
    return manifest.write(cfg, step, outputs, counts, started, extra={"track": NAME, "stack": stack_versions()})


def _inputs_settled(cfg, step):
    """True when every step STEP reads has a manifest made with today's settings: what it left is what STEP will
    read (so the disk-space check can run before the run writes anything)."""
    for dep in manifest.inputs(step):
        man = manifest.read(cfg, dep)
        if man is None or man.get("config_hash") != manifest.config_hash(cfg, dep):
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
