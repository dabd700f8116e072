"""Where the current track's extraction spends its time per sample: the pipeline's own work on each file the
server's hidden-states connector wrote, timed alone, and a real extraction through the managed vLLM server.

    ~/.local/share/specdec-eagle3/current-env/bin/python benchmarks/bench_current_extract.py \
        [--samples 160] [--concurrency 8] [--storage fp8] [--seq 512] [--takers N] [--no-prefill] [--target DIR]

Run it with the current track's venv (vLLM's CPU build here, its CUDA build on a GPU host: `--device cuda`).
The target is the small real code LM (../shared/models/code-lm-16m) when present, else the tiny target of
`inventory/local-current` (one line says so). Prints figures; it is not a timed test.

(a) The consumer's work per staged file, alone, on copies of the files the connector wrote in (b): the
    serial steps (load and validate, sha256 from a second read, rename, ledger append with fsync), then the
    pipeline's own take (one read: hash, validate, rename) alone and in a pool, and the ledger's group commit.
(b) The extract step itself (prepare first, then `run --until extract` in a process of its own with every
    consumer function timed): samples/s and tokens/s of the request phase (server start excluded), and the
    share of that time the pipeline's main thread was busy with files vs waiting on the server; with
    --prefill (default) the same samples as plain prefill (max_tokens 1) on a server with the same settings
    but no extraction: the extraction's rate against it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path[:0] = [str(FILES), str(ROOT)]
sys.dont_write_bytecode = True

CODE_LM = ROOT.parent / "shared" / "models" / "code-lm-16m"
CODE_IDS = [1, 3, 4, 6]  # vLLM capture ids of the 6-layer code LM (6: the final layer's output)
PREFIX = Path.home() / ".local" / "share" / "specdec-eagle3"
TINY = Path(os.environ.get("SPECDEC_CURRENT_WORK", PREFIX / "work-current")) / "tiny-target"
TINY_DATA = FILES / "tiny_conversations.jsonl"

# Runs `run --until extract` in this process with the consumer's functions timed (old and new names: the
# benchmark measures either version of the step); writes the timings as JSON to argv[2].
WORKER = r"""
import json, resource, shutil, sys, threading, time
from specdec_pipeline import cli, ledger
from specdec_pipeline.tracks.current import extract
from specdec_pipeline.tracks.current.backends import server
calls, local, main, cpu = [], threading.local(), threading.main_thread().ident, {}
def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def timed(owner, name, label):
    fn = getattr(owner, name, None)
    if fn is None:
        return
    def wrapper(*a, **kw):
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        cpu.setdefault("first", cpu_s())  # the pipeline process's CPU time from the first call on
        t0 = time.monotonic()
        try:
            return fn(*a, **kw)
        finally:
            local.depth = depth
            calls.append((label, threading.get_ident() == main, depth == 0, t0, time.monotonic()))
            if label == "ledger":
                cpu["last"] = cpu_s()
    setattr(owner, name, wrapper)
timed(server, "request_hidden_states", "request")
for name in ("wait_written", "staged_file", "check_file", "take_file"):
    timed(server, name, name)
timed(extract, "sha256_file", "sha256")
timed(shutil, "move", "rename")
timed(ledger, "append", "ledger")
if sys.argv[3] != "0" and hasattr(server, "takers"):  # --takers: how many threads take files, instead of the step's choice
    server.takers = lambda concurrency: int(sys.argv[3])
rc = cli.main([sys.argv[1], "run", "--until", "extract"])
json.dump({"rc": rc, "calls": calls, "cpu_s": cpu.get("last", 0) - cpu.get("first", 0)}, open(sys.argv[2], "w"))
"""


def venv_env():
    return dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")


def pipeline(cfg, *args):
    proc = subprocess.run([sys.executable, "-m", "specdec_pipeline", str(cfg), *args], env=venv_env(),
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"bench_current_extract: pipeline {args} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def ms(values):
    return f"{1000 * statistics.mean(values):7.2f} ms (median {1000 * statistics.median(values):.2f})"


# -- (b) the extraction -----------------------------------------------------------------------------------
def run_extraction(cfg_path, out, n_takers):
    timings = out / "timings.json"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", WORKER, str(cfg_path), str(timings), str(n_takers)], env=venv_env(),
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    data = json.loads(timings.read_text()) if timings.exists() else {"rc": proc.returncode, "calls": []}
    if data["rc"] != 0:
        raise SystemExit(f"bench_current_extract: the extraction failed: {proc.stderr[-3000:]}")
    (out / "extract.stderr").write_text(proc.stderr)
    return data["calls"], wall, proc.stderr, data["cpu_s"]


def report_extraction(calls, run_dir, wall, stderr, cpu_s):
    ledger_rows = [json.loads(x) for x in (run_dir / "extract" / "finished.jsonl").read_text().splitlines() if x.strip()]
    tokens = sum(r["tokens"] for r in ledger_rows)
    reqs = [c for c in calls if c[0] == "request"]
    commits = [c for c in calls if c[0] == "ledger"]
    t0, t1 = min(c[3] for c in reqs), max(c[4] for c in commits)
    first_done = min(c[4] for c in reqs)
    window = t1 - t0
    n = len(ledger_rows)
    print(f"(b) extraction: {n} samples, {tokens} tokens, {tokens / n:.0f} tokens/sample; step {wall:.1f} s "
          f"including the server start")
    print(f"    request phase {window:.2f} s (first request sent to last ledger record): {n / window:.2f} samples/s, "
          f"{tokens / window:.0f} tokens/s; from the first answer: {(tokens - ledger_rows[0]['tokens']) / (t1 - first_done):.0f} tokens/s")
    lat = [c[4] - c[3] for c in reqs]
    print(f"    server: request latency {ms(lat)}, {len(reqs)} requests")
    top = [c for c in calls if c[0] != "request" and c[2]]
    main_busy = sum(c[4] - c[3] for c in top if c[1])
    other = [c for c in top if not c[1]]
    print(f"    pipeline main thread: busy with files {main_busy:.2f} s = {100 * main_busy / window:.1f} % of the request "
          f"phase, waiting on the server (and its writes) {100 * (1 - main_busy / window):.1f} %")
    print(f"    pipeline process CPU time (user + system, all its threads) in the request phase: {cpu_s:.2f} s = "
          f"{1000 * cpu_s / n:.1f} ms per sample ({100 * cpu_s / window:.0f} % of one CPU)")
    if other:
        busy = sum(c[4] - c[3] for c in other)
        print(f"    pipeline worker threads: busy {busy:.2f} s in all = {100 * busy / window:.1f} % of one thread's time")
    for label in ("wait_written", "staged_file", "check_file", "sha256", "rename", "take_file", "ledger"):
        sel = [c[4] - c[3] for c in calls if c[0] == label]
        if sel:
            where = "main" if all(c[1] for c in calls if c[0] == label) else "workers" \
                if not any(c[1] for c in calls if c[0] == label) else "both"
            print(f"      {label:13s} {len(sel):5d} calls {ms(sel)} ({where})")
    line = [x for x in stderr.splitlines() if "the pipeline's part" in x]
    if line:
        print("    step's own line: " + line[-1].split(" INFO ", 1)[-1])
    return {"samples": n, "tokens": tokens, "window_s": window, "tokens_per_s": tokens / window,
            "tokens_per_s_after_first": (tokens - ledger_rows[0]["tokens"]) / (t1 - first_done)}


def plain_prefill(cfg_path, concurrency):
    """The prepared samples as plain completions (max_tokens 1) on a server with the extraction's settings but
    no hidden-states method: tokens/s over the request phase and from the first answer."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from specdec_pipeline import tracks, vllm_server  # noqa: PLC0415
    from specdec_pipeline.prepare import load_samples  # noqa: PLC0415
    from specdec_pipeline.serve import SERVED_NAME, bearer, post_json  # noqa: PLC0415

    cfg = tracks.load(cfg_path)
    samples = load_samples(cfg)
    port = vllm_server.port(cfg)
    argv = vllm_server.argv(cfg, port, method=["--no-enable-prefix-caching"])
    log_path = Path(cfg["run_dir"]) / "logs" / "prefill-server.log"
    with vllm_server.start(cfg, argv, port, log_path, name="prefill server") as srv:
        def one(s):
            post_json(srv.url() + "/v1/completions", {"model": SERVED_NAME, "prompt": s["input_ids"], "max_tokens": 1},
                      600, bearer(srv.api_key))
            return time.monotonic()

        one(samples[0])  # warm-up
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            done = sorted(pool.map(one, samples))
    tokens = sum(len(s["input_ids"]) for s in samples)
    window = done[-1] - started
    return {"tokens_per_s": tokens / window, "tokens_per_s_after_first":
            (tokens - len(samples[0]["input_ids"])) / max(done[-1] - done[0], 1e-9), "window_s": window}


# -- (a) the consumer's work per file, alone -----------------------------------------------------------------
def isolated(run_dir, ids, hidden, storage, scratch):
    from specdec_pipeline import ledger  # noqa: PLC0415
    from specdec_pipeline.fsutil import sha256_file  # noqa: PLC0415
    from specdec_pipeline.tracks.current.backends import server  # noqa: PLC0415

    samples = [json.loads(x) for x in (run_dir / "prepare" / "samples.jsonl").read_text().splitlines() if x.strip()]
    rows = {r["index"]: r for r in map(json.loads, (run_dir / "extract" / "finished.jsonl").read_text().splitlines())}
    src = run_dir / "extract" / "hidden_states"
    files = [(src / f"hs_{i}.safetensors", samples[i]) for i in sorted(rows)]
    sizes = [p.stat().st_size for p, dummy in files]
    print(f"(a) per staged file, {len(files)} files the connector wrote ({storage}, mean {statistics.mean(sizes) / 1e3:.0f} kB, "
          f"mean {statistics.mean(len(s['input_ids']) for dummy, s in files):.0f} tokens), each step alone:")

    def fresh(name):
        stage, dest = scratch / name / "staging", scratch / name / "dest"
        shutil.rmtree(scratch / name, ignore_errors=True)
        stage.mkdir(parents=True)
        dest.mkdir()
        staged = []
        for k, (p, s) in enumerate(files):
            shutil.copyfile(p, stage / f"req-{k}.safetensors")  # in the page cache, as the connector's write left it
            staged.append((str(stage / f"req-{k}.safetensors"), s, dest / f"hs_{k}.safetensors"))
        return stage, staged

    stage, staged = fresh("serial")
    t = {"staged_file": [], "load+validate": [], "sha256": [], "rename": [], "ledger append+fsync": []}
    ledger_path = scratch / "serial" / "finished.jsonl"
    for path, s, dest in staged:
        for label, fn in (("staged_file", lambda: server.staged_file(path, stage)),
                          ("load+validate", lambda: server.check_file(path, s["input_ids"], len(ids), hidden, storage)),
                          ("rename", lambda: shutil.move(path, dest)),
                          ("sha256", lambda: sha256_file(dest)),
                          ("ledger append+fsync", lambda: ledger.append(ledger_path, {
                              "id": s["id"], "index": 0, "tokens": len(s["input_ids"]), "size": 1, "sha256": "0" * 64}))):
            t0 = time.perf_counter()
            fn()
            t[label].append(time.perf_counter() - t0)
    for label, values in t.items():
        print(f"    {label:22s} {ms(values)}")
    per = sum(statistics.mean(v) for v in t.values())
    tok = statistics.mean(len(s["input_ids"]) for dummy, s in files)
    print(f"    {'serial sum':22s} {1000 * per:7.2f} ms per file -> at most {1 / per:.0f} samples/s, {tok / per:.0f} "
          "tokens/s for a single consumer of these files")
    out = {"serial_ms": 1000 * per}

    take = getattr(server, "take_file", None)
    if take is None:
        print("    (no take_file in this version of the step: the serial consumer above is its whole consumer)")
        return out
    for workers in (1, 2, 4):
        stage, staged = fresh(f"take{workers}")
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        def one(item, stage=stage):
            path, s, dest = item
            return take(path, stage, dest, s["input_ids"], len(ids), hidden, storage)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, staged))
        secs = time.perf_counter() - t0
        print(f"    take_file (one read: hash, validate, rename), {workers} thread(s): {1000 * secs / len(staged):6.2f} ms "
              f"per file -> {len(staged) / secs:.0f} files/s, {tok * len(staged) / secs:.0f} tokens/s")
        out[f"take{workers}_files_per_s"] = len(staged) / secs
    for batch in (1, 8, 32):
        path = scratch / f"group{batch}.jsonl"
        recs = [{"id": k, "index": k, "tokens": 1, "size": 1, "sha256": "0" * 64} for k in range(batch)]
        t0 = time.perf_counter()
        rounds = max(1, 256 // batch)
        for dummy in range(rounds):
            ledger.append(path, *recs)
        secs = (time.perf_counter() - t0) / rounds
        print(f"    ledger group commit of {batch:2d} records: {1000 * secs:6.2f} ms ({1000 * secs / batch:.3f} ms per record)")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--storage", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--target", type=Path, default=CODE_LM)
    ap.add_argument("--no-prefill", action="store_true")
    ap.add_argument("--takers", type=int, default=0, help="threads that take files (default: the step's own choice)")
    ap.add_argument("--keep", type=Path, help="keep the run directory here (default: a temporary one)")
    args = ap.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print(f"skip: no vLLM in {sys.executable}; run with the current track's venv ({PREFIX / 'current-env'}/bin/python)")
        return 0
    target, data, ids = args.target, args.target / "conversations.jsonl", CODE_IDS
    if not (target / "config.json").exists():
        if not (TINY / "config.json").exists():
            print(f"skip: neither the code LM ({target}) nor the tiny target ({TINY}) is there")
            return 0
        print(f"the code LM is absent ({target}): using the tiny target {TINY}")
        target, data, ids = TINY, TINY_DATA, [2, 4, 5, 8]
    load = os.getloadavg()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"load average {load[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}; target {target.name}, device {args.device}")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        run_dir = base / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg = {"run_dir": str(run_dir), "track": "current", "target": {"path": str(target), "trust_remote_code": False},
               "dataset": {"source": str(data), "max_samples": args.samples, "heldout": 0},
               "seq_length": args.seq,
               "extract": {"layer_ids": ids, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.5},
               "vocab": {"draft_vocab_size": 128},
               "current": {"device": args.device, "hs_storage": args.storage, "concurrency": args.concurrency,
                           "enforce_eager": True, "ready_timeout_s": 900, "cpu_kvcache_gib": 2}}
        cfg_path = base / "run.json"
        cfg_path.write_text(json.dumps(cfg))
        pipeline(cfg_path, "run", "--until", "prepare")
        calls, wall, stderr, cpu_s = run_extraction(cfg_path, base, args.takers)
        from specdec_pipeline import tracks  # noqa: PLC0415
        from specdec_pipeline.target import text_config  # noqa: PLC0415

        hidden = int(text_config(tracks.load(cfg_path)).hidden_size)
        isolated(run_dir, ids, hidden, args.storage, base / "scratch")
        fig = report_extraction(calls, run_dir, wall, stderr, cpu_s)
        if not args.no_prefill:
            pre = plain_prefill(cfg_path, args.concurrency)
            print(f"(b) plain prefill, same samples, settings and concurrency, no extraction: {pre['tokens_per_s']:.0f} "
                  f"tokens/s ({pre['window_s']:.2f} s; from the first answer {pre['tokens_per_s_after_first']:.0f})")
            print(f"    extraction against plain prefill: {100 * fig['tokens_per_s'] / pre['tokens_per_s']:.1f} % "
                  f"(from the first answer: {100 * fig['tokens_per_s_after_first'] / pre['tokens_per_s_after_first']:.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
