"""Step 5 on the current track - export: the last epoch's speculators-format checkpoint, checked, copied to export/."""

import json
import shutil
import time

from specdec_pipeline import vocab
from specdec_pipeline.config import run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, read_json
from specdec_pipeline.tracks.current.common import _write_manifest
from specdec_pipeline.tracks.current.train import epochs_done


def check_export(model_path, conf, aux_ids, d2t, t2d):
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    if list(conf.get("eagle_aux_hidden_state_layer_ids") or []) != list(aux_ids):
        raise ValueError(f"config.json: eagle_aux_hidden_state_layer_ids is {conf.get('eagle_aux_hidden_state_layer_ids')}, "
                         f"expected {aux_ids}")
    with safe_open(str(model_path), framework="pt") as f:
        keys = set(f.keys())
        for name in ("d2t", "t2d"):
            if name not in keys:
                raise ValueError(f"{model_path}: no {name} tensor")
        if not torch.equal(f.get_tensor("d2t").to(d2t.dtype), d2t) or not torch.equal(f.get_tensor("t2d").to(t2d.dtype), t2d):
            raise ValueError(f"{model_path}: d2t/t2d differ from the vocab step's mapping")


def run(cfg):
    started = time.time()
    done = epochs_done(run_path(cfg, "train", "checkpoints"))
    if not done:
        raise PipelineError("export: no checkpoint under train/checkpoints; run the train step first.")
    src = run_path(cfg, "train", "checkpoints", str(done[-1]))
    ids = read_json(run_path(cfg, "extract", "data_config.json"))["layer_ids"]
    aux = ids[:-1]  # vLLM capture ids are what the served draft asks the target for
    conf = json.loads((src / "config.json").read_text())
    conf.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(cfg["target"]["path"])
    d2t, t2d = vocab.load(cfg)
    out = run_path(cfg, "export")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors",
                     validate=lambda p: check_export(p, conf, aux, d2t, t2d)) as tmp:
        shutil.copyfile(src / "model.safetensors", tmp)
    with atomic_path(out / "config.json", validate=lambda p: json.loads(p.read_text())) as tmp:
        tmp.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copyfile(src / extra, out / extra)
    counts = {"epoch": done[-1], "capture_layer_ids": ids, "eagle_aux_hidden_state_layer_ids": aux,
              "norm_before_fc": conf.get("norm_before_fc"), "norm_output": conf.get("norm_output")}
    return _write_manifest(cfg, "export", [out / "config.json", out / "model.safetensors"], counts, started)
