"""Step 2 on the current track - extract: hidden states from a managed vLLM server (backends/server.py).

Resume: extract/finished.jsonl lists finished sample ids (appended after the file was validated and renamed into
place); files the server wrote for unfinished requests sit in extract/staging and are discarded on the next run.
"""

import shutil
import time

from specdec_pipeline import ledger
from specdec_pipeline.config import extract_dtype, run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import dir_size, open_step_dir, sha256_file, swap_in, write_json
from specdec_pipeline.prepare import load_samples
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.serve import VllmServer, free_port
from specdec_pipeline.target import text_config
from specdec_pipeline.tracks.current import extract_bytes_per_token, layer_ids
from specdec_pipeline.tracks.current.backends import server as current_server
from specdec_pipeline.tracks.current.common import (
    _dataset_outputs,
    _inputs_settled,
    _step_dir,
    _write_manifest,
    disk_preflight,
    write_dataset,
)


def _extract_settings(cfg):
    """The capture ids (checked against the target's config) after the server's dtype (hs_storage: config.load)."""
    extract_dtype(cfg)
    return layer_ids(cfg)


def _extract_plan(cfg):
    """What the extract step decides before it writes, reading only: the settings checked, where it builds, what
    is left to do, and that it fits on the disk."""
    ids = _extract_settings(cfg)
    samples = load_samples(cfg)
    hidden = int(text_config(cfg).hidden_size)
    final = run_path(cfg, "extract")
    out_dir, discard, identity = _step_dir(cfg, "extract")
    finished = {} if discard else ledger.read(out_dir / "finished.jsonl", extra=("index",))
    todo = [s for s in samples if s["id"] not in finished]
    kept = f"; the finished extraction in {final} is kept until the new one is complete" if out_dir != final else ""
    per_token = disk_preflight(cfg, out_dir, sum(len(s["input_ids"]) for s in todo), len(ids), hidden, kept,
                               reclaim=dir_size(out_dir) if discard else 0)
    return {"ids": ids, "samples": samples, "hidden": hidden, "final": final, "out_dir": out_dir,
            "discard": discard, "identity": identity, "finished": finished, "todo": todo, "per_token": per_token}


def check(cfg):
    """The extract settings, checked before the run writes anything; the disk space too when the prepared
    samples it would read are settled. Returns the capture ids."""
    return _extract_plan(cfg)["ids"] if _inputs_settled(cfg, "extract") else _extract_settings(cfg)


def run(cfg):
    started = time.time()
    # Every setting and the disk space are checked before anything in the run directory is touched.
    plan = _extract_plan(cfg)
    ids, samples, hidden, final, out_dir = plan["ids"], plan["samples"], plan["hidden"], plan["final"], plan["out_dir"]
    finished, todo, per_token = plan["finished"], plan["todo"], plan["per_token"]
    storage = cfg["current"]["hs_storage"]
    finished_path = out_dir / "finished.jsonl"
    if out_dir != final:
        log.info("extract: config or inputs changed - building the new extraction in %s; %s is kept until it is "
                 "complete", out_dir, final)
    open_step_dir("extract", out_dir, plan["discard"], plan["identity"])
    staging, hs_dir = out_dir / "staging", out_dir / "hidden_states"
    if staging.exists():  # what the server wrote for requests a killed run never recorded
        log.info("extract: discarding %d files of an interrupted run in %s", sum(1 for dummy in staging.iterdir()), staging)
        shutil.rmtree(staging)
    staging.mkdir()
    hs_dir.mkdir(exist_ok=True)
    for stale in hs_dir.glob(".*.tmp"):
        stale.unlink()
    ledger.read(finished_path, repair=True)  # a torn last line of a killed run: the next append starts a line

    index = {s["id"]: i for i, s in enumerate(samples)}
    write_dataset(samples, out_dir / "dataset")
    log.info("extract: %d samples, %d finished, %d to do; capture ids %s; %s storage (%d B/token); server-side",
             len(samples), len(finished), len(todo), ids, storage, per_token)
    prog = Progress(run_path(cfg, "progress.json"), "extract", len(samples))
    prog.resume_from(len(finished))

    if todo:
        port = int(cfg["current"]["port"]) or free_port()
        argv = current_server.server_argv(cfg, ids, staging, port)
        log.info("extract: starting the server: %s", " ".join(argv))
        with VllmServer(argv, port=port, env=current_server.server_env(cfg),
                        log_path=run_path(cfg, "logs", "extract-server.log"),
                        ready_timeout_s=float(cfg["current"]["ready_timeout_s"])) as srv:
            for sample, staged in current_server.extract_all(srv.url(), todo, cfg["current"]["concurrency"],
                                                             float(cfg["current"]["request_timeout_s"]),
                                                             staging, srv.api_key):  # staged: validated
                i = index[sample["id"]]
                dest = hs_dir / f"hs_{i}.safetensors"
                try:
                    current_server.check_file(staged, sample["input_ids"], len(ids), hidden, storage)
                except ValueError as exc:
                    raise PipelineError(f"extract: the server's file for sample {sample['id']} is not valid ({exc}); "
                                        "see the server log.") from None
                shutil.move(staged, dest)  # same filesystem: a rename
                ledger.append(finished_path, {"id": sample["id"], "index": i, "tokens": len(sample["input_ids"]),
                                              "size": dest.stat().st_size, "sha256": sha256_file(dest)})
                finished[sample["id"]] = True
                prog.update(len(finished), tokens=len(sample["input_ids"]))
    prog.finish(f"{len(finished)} samples")
    shutil.rmtree(staging, ignore_errors=True)

    finished = ledger.read(finished_path, extra=("index",))
    if set(finished) != set(index):
        raise PipelineError(f"extract: {finished_path} lists {len(finished)} samples, expected {len(index)}; "
                            "re-run the pipeline to resume.")
    outputs = {f"extract/hidden_states/hs_{r['index']}.safetensors": {"size": r["size"], "sha256": r["sha256"]}
               for r in finished.values()}
    tokens = sum(r["tokens"] for r in finished.values())
    data_config = {"layer_ids": ids, "hidden_size": hidden, "hs_storage": storage, "bytes_per_token": per_token,
                   "backend": "vllm-server", "layout": "speculators-0.9", "file_pattern": "hidden_states/hs_{idx}.safetensors",
                   "target": cfg["target"]["path"]}
    write_json(out_dir / "data_config.json", data_config)
    if out_dir != final:
        log.info("extract: the new extraction is complete - replacing %s", final)
        swap_in(out_dir, final)
    outputs.update(_dataset_outputs(cfg, final / "dataset"))
    counts = {"samples": len(finished), "tokens": tokens, "layer_ids": ids, "hidden_size": hidden,
              "hs_storage": storage, "bytes_per_token": per_token,
              "bytes": sum(r["size"] for r in finished.values())}
    return _write_manifest(cfg, "extract", outputs, counts, started)


def space_needed(cfg):
    """Bytes the whole extraction needs (for the disk-full message): every prepared token's hidden states."""
    tokens = sum(len(s["input_ids"]) for s in load_samples(cfg))
    per_token = extract_bytes_per_token(cfg, len(layer_ids(cfg)), int(text_config(cfg).hidden_size))
    return int(tokens * per_token * max(float(cfg["extract"]["disk_margin"]), 1.0))
