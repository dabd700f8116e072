"""Step 2 on the current track - extract: hidden states from a managed vLLM server (backends/server.py).

Resume: extract/finished.jsonl lists finished sample ids (appended after the file was validated and renamed into
place); files the server wrote for unfinished requests sit in extract/staging and are discarded on the next run.

The files are taken (validated, hashed, renamed: backends/server.take_file) in threads of their own while the
requests stay in flight; every file taken by then goes into one ledger commit (one fsync), and only after it
returned are those samples counted as finished. A kill loses only samples not yet in the ledger: their files
(renamed or still in staging) are made again on the next run.
"""

import contextlib
import shutil
import time

from specdec_pipeline import disk, ledger, manifest, vllm_server
from specdec_pipeline.config import extract_dtype, run_path
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import dir_size, open_step_dir, swap_in, write_json
from specdec_pipeline.prepare import load_samples
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.target import text_config
from specdec_pipeline.tracks.current import rules
from specdec_pipeline.tracks.current.backends import server as current_server
from specdec_pipeline.tracks.current.common import _dataset_outputs, _inputs_settled, _write_manifest, write_dataset
from specdec_pipeline.tracks.current.rules import layer_ids


def _extract_settings(cfg):
    """The capture ids (checked against the target's config) after the server's dtype (hs_storage: tracks.load)."""
    extract_dtype(cfg)
    return layer_ids(cfg)


def _extract_plan(cfg):
    """What the extract step decides before it writes, reading only: the settings checked, where it builds, what
    is left to do, and that it fits on the disk."""
    ids = _extract_settings(cfg)
    samples = load_samples(cfg)
    hidden = int(text_config(cfg).hidden_size)
    final = run_path(cfg, "extract")
    out_dir, discard, identity = manifest.plan_dir(cfg, "extract")
    finished = {} if discard else ledger.read(out_dir / "finished.jsonl", extra=("index",))
    todo = [s for s in samples if s["id"] not in finished]
    kept = f"; the finished extraction in {final} is kept until the new one is complete" if out_dir != final else ""
    per_token = disk.preflight(cfg, rules, out_dir, sum(len(s["input_ids"]) for s in todo), len(ids), hidden, kept,
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
        port = vllm_server.port(cfg)
        argv = current_server.server_argv(cfg, ids, staging, port)
        log.info("extract: starting the server: %s", " ".join(argv))
        with vllm_server.start(cfg, argv, port, run_path(cfg, "logs", "extract-server.log")) as srv:
            _request_phase(cfg, srv, todo, index, finished, prog, {
                "staging": staging, "hs_dir": hs_dir, "ledger": finished_path, "n_layers": len(ids), "hidden": hidden,
                "storage": storage})
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


def _request_phase(cfg, srv, todo, index, finished, prog, where):
    """Send TODO to the server SRV, take each file it writes into WHERE["hs_dir"] (a pool of takers) and commit
    what is taken to the ledger in groups (one fsync each); FINISHED and PROG learn of a sample only after its
    commit. Logs, at the end, how the time was spent: the pipeline's part against the server's."""
    staging, hs_dir, n_layers = where["staging"], where["hs_dir"], where["n_layers"]

    def take(sample, real):
        i = index[sample["id"]]
        try:
            got = current_server.take_file(real, staging, hs_dir / f"hs_{i}.safetensors", sample["input_ids"],
                                           n_layers, where["hidden"], where["storage"])
        except ValueError as exc:
            raise PipelineError(f"extract: the server's file for sample {sample['id']} is not valid ({exc}); "
                                "see the server log.") from None
        return {"id": sample["id"], "index": i, "tokens": len(sample["input_ids"]), **got}

    concurrency = cfg["current"]["concurrency"]
    n_takers = current_server.takers(concurrency)
    started = time.monotonic()
    waited, commits, commit_s, took = 0.0, 0, 0.0, []
    batches = current_server.extract_batches(srv.url(), todo, concurrency, vllm_server.request_timeout(cfg), staging,
                                             srv.api_key, take=take, n_takers=n_takers)
    with contextlib.closing(batches):  # on any error the requests and takes still running are ended here
        while True:
            t0 = time.monotonic()
            batch = next(batches, None)
            t1 = time.monotonic()
            waited += t1 - t0
            if batch is None:
                break
            records = [r for dummy, r in batch]
            ledger.append(where["ledger"], *({k: r[k] for k in ("id", "index", "tokens", "size", "sha256")}
                                             for r in records))
            commits += 1
            commit_s += time.monotonic() - t1
            took += records
            for r in records:  # only now finished: the commit has returned
                finished[r["id"]] = True
            prog.update(len(finished), tokens=sum(r["tokens"] for r in records))
    wall = max(time.monotonic() - started, 1e-9)
    tokens = sum(r["tokens"] for r in took)
    busy = sum(r["busy_s"] for r in took)
    log.info("extract: %d samples, %d tokens in %.1f s of requests: %.2f samples/s, %.0f tokens/s; the pipeline's part: "
             "%d takers busy %.1f ms per file (%.0f %% of their time) and waiting %.1f ms per file for the connector's "
             "write; %d ledger commits of %.1f samples, %.1f ms each; the main thread waited on the server and the "
             "takers %.0f %% of the time", len(took), tokens, wall, len(took) / wall, tokens / wall, n_takers,
             1000 * busy / max(len(took), 1), 100 * busy / (wall * n_takers),
             1000 * sum(r["wait_s"] for r in took) / max(len(took), 1), commits, len(took) / max(commits, 1),
             1000 * commit_s / max(commits, 1), 100 * waited / wall)


def space_needed(cfg):
    """Bytes the whole extraction writes (for the disk-full message): disk.space_needed."""
    return disk.space_needed(cfg, rules)
