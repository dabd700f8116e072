"""Step 2 - extract: hidden states of the target at the capture layers, one data_<id>.pt per sample.

On-disk format (speculators' data format v1): {"input_ids": int64[seq], "hidden_states": [dtype[seq, H]] * n,
"loss_mask": int64[seq]}. Capture convention (both backends): entry j is the residual stream after decoder
layer layer_ids[j] (its output, before the final norm); the last entry is the target of training.

Resume: extract/finished.jsonl lists finished sample ids (one JSON line each, appended after the sample
file was written atomically and validated); a resumed run skips exactly those ids whose file still has the
recorded size and sha256 (the sha256 up to manifest.HASH_LIMIT) and redoes the others. New settings never touch
the finished extraction: the new one is built in extract.new and swapped in when complete.
"""

import hashlib
import io
import time

from specdec_pipeline import disk, ledger, manifest, remote_code
from specdec_pipeline.config import extract_dtype, run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import (
    dir_size,
    open_step_dir,
    recover_swap,
    sha256_file,
    swap_in,
    write_bytes_atomic,
    write_json,
)
from specdec_pipeline.prepare import load_samples
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.target import text_config
from specdec_pipeline.tracks.patched import rules
from specdec_pipeline.tracks.patched.rules import layer_ids

# torch is imported by the functions that need it: the settings check (and `validate`) stays light.


def validate_sample(path, expect_ids, expect_mask, n_layers, hidden, dtype):
    """Raise ValueError unless PATH holds the sample exactly as expected."""
    import torch  # noqa: PLC0415

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


def space_needed(cfg):
    """Bytes the whole extraction writes (for the disk-full message): disk.space_needed."""
    return disk.space_needed(cfg, rules)


def check_finished(out_dir, finished):
    """Ids in FINISHED whose sample file is missing, unreadable or not the file that was recorded."""
    bad = {}
    for i, rec in sorted(finished.items()):
        p = out_dir / f"data_{i}.pt"
        try:
            size = p.stat().st_size
            if size != rec["size"]:
                bad[i] = f"size {size} B, recorded {rec['size']} B"
            elif size <= manifest.HASH_LIMIT and sha256_file(p) != rec["sha256"]:
                bad[i] = "content differs from the recorded sha256"
        except OSError as exc:
            bad[i] = f"unreadable ({exc.strerror or exc})"
    return bad


def _backend_class(cfg):
    if cfg["extract"]["backend"] == "vllm":
        from specdec_pipeline.tracks.patched.backends.vllm_backend import VllmBackend  # noqa: PLC0415

        return VllmBackend
    from specdec_pipeline.tracks.patched.backends.hf_backend import HfBackend  # noqa: PLC0415

    return HfBackend


def storage_dtype(cfg):
    """extract.dtype as a torch dtype; an unknown name is one PipelineError."""
    import torch  # noqa: PLC0415

    return getattr(torch, extract_dtype(cfg))


def check(cfg):
    """The extract settings that need no step output (the pipeline checks them before it touches anything)."""
    layer_ids(cfg)
    extract_dtype(cfg)


def run(cfg):
    started = time.time()
    final = run_path(cfg, "extract")
    # Everything about the new settings is checked before any file is touched.
    samples = load_samples(cfg)
    ids = layer_ids(cfg)
    tc = text_config(cfg)
    dtype = storage_dtype(cfg)
    backend_cls = _backend_class(cfg)
    identity = manifest.identity(cfg, "extract")
    ran = remote_code.record(cfg)["files"]
    if ran:  # the target's own code (trust_remote_code): a changed file starts the extraction over, not a resume
        identity["remote_code"] = ran

    # Same settings: resume in place. Other settings: build the new extraction in extract.new and swap it in when
    # complete - the finished samples stay in extract/ until then (a failure or a kill loses nothing).
    recover_swap(final)
    out_dir, discard, identity = manifest.plan_dir(cfg, "extract", identity, fix="delete it (the extraction in that "
                                                   "directory is then started over)")
    detail, fix = "", None
    if out_dir != final:
        log.info("extract: config or prepared data changed - building the new extraction in %s; %s is kept "
                 "until it is complete", out_dir, final)
        detail = f"; the finished extraction in {final} is kept until the new one is complete"
        fix = (f"free space there, or remove {final} yourself to start over in its place, or lower "
               "eagle3_pipeline_max_samples")
    finished_path = out_dir / "finished.jsonl"
    finished = {} if discard else ledger.read(finished_path)
    bad = check_finished(out_dir, finished)
    for i, why in bad.items():
        log.warning("extract: finished sample %s is redone: %s", out_dir / f"data_{i}.pt", why)
        del finished[i]
    todo = [s for s in samples if s["id"] not in finished]
    disk.preflight(cfg, rules, out_dir, sum(len(s["input_ids"]) for s in todo), len(ids), tc.hidden_size, detail,
                   fix, reclaim=dir_size(out_dir) if discard else 0)

    open_step_dir("extract", out_dir, discard, identity)
    # A run killed while writing a sample leaves its temporary file behind; the sample itself is not in
    # finished.jsonl, so it is redone - the stale partial file is only removed.
    for stale in out_dir.glob(".*.tmp"):
        log.info("extract: removing %s left by an interrupted run", stale.name)
        stale.unlink()
    ledger.read(finished_path, repair=True)
    if bad:
        ledger.rewrite(finished_path, finished)
    log.info("extract: %d samples, %d finished, %d to do; layers %s; backend %s", len(samples), len(finished),
             len(todo), ids, cfg["extract"]["backend"])
    prog = Progress(run_path(cfg, "progress.json"), "extract", len(samples))
    prog.resume_from(len(finished))

    if todo:
        backend = backend_cls(cfg, ids, dtype)
        for batch in backend.batches(todo):
            for sample, hidden_states in zip(batch, backend.run(batch), strict=True):
                _save(out_dir, finished_path, sample, hidden_states, len(ids), tc.hidden_size, dtype)
                finished[sample["id"]] = True
                prog.update(len(finished), tokens=len(sample["input_ids"]))
    prog.finish(f"{len(finished)} samples")

    finished = ledger.read(finished_path)
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
    if out_dir != final:
        log.info("extract: the new extraction is complete - replacing %s", final)
        swap_in(out_dir, final)
    return manifest.write(cfg, "extract", outputs, counts, started)


def sample_bytes(data):
    """torch.save of DATA into memory: the bytes depend only on the tensors (a file name would be stored in
    the archive), so a redone sample is byte-identical and keeps its recorded sha256."""
    import torch  # noqa: PLC0415

    buf = io.BytesIO()
    torch.save(data, buf)
    return buf.getvalue()


def _save(out_dir, finished_path, sample, hidden_states, n_layers, hidden, dtype):
    import torch  # noqa: PLC0415

    dest = out_dir / f"data_{sample['id']}.pt"
    data = {"input_ids": torch.tensor(sample["input_ids"], dtype=torch.long),
            "hidden_states": [h.to(dtype).contiguous() for h in hidden_states],
            "loss_mask": torch.tensor(sample["loss_mask"], dtype=torch.long)}

    def check(p):
        validate_sample(p, sample["input_ids"], sample["loss_mask"], n_layers, hidden, dtype)

    blob = sample_bytes(data)
    write_bytes_atomic(dest, blob, validate=check)
    ledger.append(finished_path, {"id": sample["id"], "tokens": len(sample["input_ids"]),
                                  "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
