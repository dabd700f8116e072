"""Step 2 - extract: hidden states of the target at the capture layers, one data_<id>.pt per sample.

On-disk format (speculators' data format v1): {"input_ids": int64[seq], "hidden_states": [dtype[seq, H]] * n,
"loss_mask": int64[seq]}. Capture convention (both backends): entry j is the residual stream after decoder
layer layer_ids[j] (its output, before the final norm); the last entry is the target of training.

Resume: extract/finished.jsonl lists finished sample ids (one JSON line each, appended after the sample
file was written atomically and validated); a resumed run skips exactly those ids.
"""

import json
import os
import shutil
import time

import torch

from specdec_pipeline import manifest
from specdec_pipeline.config import run_path, step_config
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, read_json, sha256_file, sha256_json, write_json
from specdec_pipeline.prepare import load_samples
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.target import default_layer_ids, text_config

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def layer_ids(cfg):
    tc = text_config(cfg)
    ids = cfg["extract"]["layer_ids"] or default_layer_ids(tc.num_hidden_layers)
    bad = [k for k in ids if not 0 <= int(k) < tc.num_hidden_layers]
    if bad or len(ids) < 2:
        raise PipelineError(f"extract.layer_ids {ids}: expected at least 2 layer indices in 0..{tc.num_hidden_layers - 1} "
                            f"for {cfg['target']['path']} ({tc.num_hidden_layers} layers); fix the profile.")
    return [int(k) for k in ids]


def validate_sample(path, expect_ids, expect_mask, n_layers, hidden, dtype):
    """Raise ValueError unless PATH holds the sample exactly as expected."""
    data = torch.load(path, weights_only=True, map_location="cpu")
    ids, mask, hs = data["input_ids"], data["loss_mask"], data["hidden_states"]
    if ids.dtype != torch.long or ids.tolist() != list(expect_ids):
        raise ValueError(f"{path}: input_ids differ from the prepared sample")
    if mask.tolist() != list(expect_mask):
        raise ValueError(f"{path}: loss_mask differs from the prepared sample")
    if len(hs) != n_layers:
        raise ValueError(f"{path}: {len(hs)} hidden-state tensors, expected {n_layers}")
    for j, h in enumerate(hs):
        if tuple(h.shape) != (len(expect_ids), hidden):
            raise ValueError(f"{path}: hidden_states[{j}] shape {tuple(h.shape)}, expected ({len(expect_ids)}, {hidden})")
        if h.dtype != dtype:
            raise ValueError(f"{path}: hidden_states[{j}] dtype {h.dtype}, expected {dtype}")
        if not torch.isfinite(h).all():
            raise ValueError(f"{path}: hidden_states[{j}] holds NaN or Inf")


def bytes_needed(n_tokens, n_layers, hidden, dtype):
    return n_tokens * n_layers * hidden * torch.tensor([], dtype=dtype).element_size()


def disk_preflight(cfg, out_dir, n_tokens, n_layers, hidden, dtype):
    need = int(bytes_needed(n_tokens, n_layers, hidden, dtype) * float(cfg["extract"]["disk_margin"]))
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise PipelineError(
            f"extract: {out_dir} has {free / 1e9:.1f} GB free but the hidden states of the remaining samples need "
            f"about {need / 1e9:.1f} GB ({n_tokens} tokens x {n_layers} layers x {hidden} hidden x "
            f"{torch.tensor([], dtype=dtype).element_size()} B, margin {cfg['extract']['disk_margin']}); "
            "point eagle3_pipeline_work_dir at a larger filesystem or lower eagle3_pipeline_max_samples.")
    return need, free


def read_finished(path):
    """Finished ids from finished.jsonl; a torn last line (killed mid-append) is ignored."""
    done = {}
    if not path.exists():
        return done
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[rec["id"]] = rec
    return done


def _append_finished(path, rec):
    with open(path, "a") as f:
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run(cfg):
    started = time.time()
    out_dir = run_path(cfg, "extract")
    state_path = out_dir / "state.json"
    identity = {"config": sha256_json(step_config(cfg, "extract")), "inputs": manifest.input_digests(cfg, "extract")}
    if read_json(state_path) != identity and out_dir.exists():
        log.info("extract: config or prepared data changed - starting over in %s", out_dir)
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(state_path, identity)
    # A run killed while writing a sample leaves its temporary file behind; the sample itself is not in
    # finished.jsonl, so it is redone - the stale partial file is only removed.
    for stale in out_dir.glob(".*.tmp"):
        log.info("extract: removing %s left by an interrupted run", stale.name)
        stale.unlink()

    samples = load_samples(cfg)
    ids = layer_ids(cfg)
    tc = text_config(cfg)
    dtype = DTYPES[cfg["extract"]["dtype"]]
    finished_path = out_dir / "finished.jsonl"
    finished = read_finished(finished_path)
    todo = [s for s in samples if s["id"] not in finished]
    disk_preflight(cfg, out_dir, sum(len(s["input_ids"]) for s in todo), len(ids), tc.hidden_size, dtype)
    log.info("extract: %d samples, %d finished, %d to do; layers %s; backend %s", len(samples), len(finished),
             len(todo), ids, cfg["extract"]["backend"])
    prog = Progress(run_path(cfg, "progress.json"), "extract", len(samples))
    prog.resume_from(len(finished))

    if cfg["extract"]["backend"] == "vllm":
        from specdec_pipeline.backends.vllm_backend import VllmBackend as Backend  # noqa: PLC0415
    else:
        from specdec_pipeline.backends.hf_backend import HfBackend as Backend  # noqa: PLC0415
    if todo:
        backend = Backend(cfg, ids, dtype)
        for batch in backend.batches(todo):
            for sample, hidden_states in zip(batch, backend.run(batch), strict=True):
                _save(out_dir, finished_path, sample, hidden_states, len(ids), tc.hidden_size, dtype)
                finished[sample["id"]] = True
                prog.update(len(finished), tokens=len(sample["input_ids"]))
    prog.finish(f"{len(finished)} samples")

    finished = read_finished(finished_path)
    expected = {s["id"] for s in samples}
    if set(finished) != expected:
        raise PipelineError(f"extract: {finished_path} lists {len(finished)} samples, expected {len(expected)}; "
                            "re-run the pipeline to resume.")
    outputs = {f"extract/data_{i}.pt": {"size": finished[i]["size"], "sha256": finished[i]["sha256"]}
               for i in sorted(finished)}
    counts = {"samples": len(finished), "tokens": sum(r["tokens"] for r in finished.values()), "layer_ids": ids,
              "hidden_size": tc.hidden_size, "dtype": cfg["extract"]["dtype"],
              "bytes": sum(r["size"] for r in finished.values())}
    write_json(out_dir / "data_config.json", {"layer_ids": ids, "hidden_size": tc.hidden_size, "dtype": cfg["extract"]["dtype"],
                                              "backend": cfg["extract"]["backend"], "file_pattern": "data_{idx}.pt",
                                              "data_format_version": 1, "target": cfg["target"]["path"]})
    return manifest.write(cfg, "extract", outputs, counts, started)


def _save(out_dir, finished_path, sample, hidden_states, n_layers, hidden, dtype):
    dest = out_dir / f"data_{sample['id']}.pt"
    data = {"input_ids": torch.tensor(sample["input_ids"], dtype=torch.long),
            "hidden_states": [h.to(dtype).contiguous() for h in hidden_states],
            "loss_mask": torch.tensor(sample["loss_mask"], dtype=torch.long)}

    def check(p):
        validate_sample(p, sample["input_ids"], sample["loss_mask"], n_layers, hidden, dtype)

    with atomic_path(dest, validate=check) as tmp:
        torch.save(data, tmp)
    _append_finished(finished_path, {"id": sample["id"], "tokens": len(sample["input_ids"]),
                                     "size": dest.stat().st_size, "sha256": sha256_file(dest)})
