"""Step 5 - export: a speculators-format checkpoint vLLM can load.

From the last epoch: config.json with eagle_aux_hidden_state_layer_ids in vLLM's convention (vLLM captures
the INPUT of layer k; the data holds the OUTPUT of layer k, so capture ids [2, 30, 58] become [3, 31, 59]),
the verifier path, and model.safetensors carrying d2t and t2d.
"""

import json
import shutil
import time

from specdec_pipeline import manifest, vocab
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, check_space, read_json, recover_swap, staging_dir, swap_in
from specdec_pipeline.tracks.patched.rules import vllm_layer_ids

REQUIRED = ("d2t", "t2d", "fc.weight", "lm_head.weight", "norm.weight")


def last_checkpoint(cfg):
    ckpt = run_path(cfg, "train", "checkpoints")
    epochs = sorted(int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()) if ckpt.exists() else []
    if not epochs:
        raise PipelineError(f"export: no checkpoint under {ckpt}; run the train step first.")
    return ckpt / str(epochs[-1])


def space_needed(cfg, src=None):
    """Bytes the export writes: the last checkpoint's weights, d2t/t2d and the small files."""
    src = src or last_checkpoint(cfg)
    vocab_dir = run_path(cfg, "vocab")
    extra = sum(p.stat().st_size for p in (vocab_dir / "d2t.npy", vocab_dir / "t2d.npy") if p.exists())
    return int(((src / "model.safetensors").stat().st_size + extra) * 1.05) + (64 << 10)


def export_config(src_config, capture_ids, target_path):
    conf = dict(src_config)
    conf["eagle_aux_hidden_state_layer_ids"] = vllm_layer_ids(capture_ids[:-1])
    conf.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(target_path)
    return conf


def check_checkpoint(model_path, config, d2t, t2d):
    import torch  # noqa: PLC0415 - heavy: imported when the step runs
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(model_path), framework="pt") as f:
        keys = set(f.keys())
        missing = [k for k in REQUIRED if k not in keys]
        if missing:
            raise ValueError(f"{model_path}: missing tensors {missing}")
        if not torch.equal(f.get_tensor("d2t"), d2t) or not torch.equal(f.get_tensor("t2d"), t2d):
            raise ValueError(f"{model_path}: d2t/t2d differ from the vocab step's mapping")
        hidden = config["transformer_layer_config"]["hidden_size"]
        n_aux = len(config["eagle_aux_hidden_state_layer_ids"])
        if tuple(f.get_tensor("fc.weight").shape) != (hidden, n_aux * hidden):
            raise ValueError(f"{model_path}: fc.weight does not take {n_aux} x {hidden} inputs")


def run(cfg):
    from safetensors import safe_open  # noqa: PLC0415 - heavy: imported when the step runs
    from safetensors.torch import save_file  # noqa: PLC0415

    started = time.time()
    src = last_checkpoint(cfg)
    capture_ids = read_json(run_path(cfg, "extract", "data_config.json"))["layer_ids"]
    final = run_path(cfg, "export")
    check_space("export", final, space_needed(cfg, src), "the last checkpoint's weights plus d2t/t2d")
    conf = export_config(json.loads((src / "config.json").read_text()), capture_ids, cfg["target"]["path"])
    d2t, t2d = vocab.load(cfg)
    tensors = {}
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            tensors[k] = f.get_tensor(k)
    tensors["d2t"], tensors["t2d"] = d2t, t2d

    # The new export is built in export.new and replaces the earlier one only when complete and validated.
    recover_swap(final)
    out = staging_dir(final)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with atomic_path(out / "model.safetensors", validate=lambda p: check_checkpoint(p, conf, d2t, t2d)) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    with atomic_path(out / "config.json", validate=lambda p: json.loads(p.read_text())) as tmp:
        tmp.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for extra in ("config.py", "generation_config.json"):
        if (src / extra).exists():
            shutil.copyfile(src / extra, out / extra)
    swap_in(out, final)
    out = final
    counts = {"epoch": int(src.name), "capture_layer_ids": capture_ids,
              "eagle_aux_hidden_state_layer_ids": conf["eagle_aux_hidden_state_layer_ids"],
              "tensors": len(tensors)}
    return manifest.write(cfg, "export", [out / "config.json", out / "model.safetensors"], counts, started)
