"""Prove the current track (vLLM >= 0.25 + speculators 0.9 + hs-connectors) on a real GPU, in one run.

Run it through tests/gpu/run-current.sh (which installs the carried vLLM CUDA build and wheels first). Phases, in
order of importance (each records PASS/FAIL rows and figures; a failed phase does not stop the next one; a phase is
skipped once CURRENT_PROOF_DEADLINE_S has passed):
  code-fp8   the pipeline's current track on the code LM (../shared/models/code-lm-16m): prepare, extract through a
             managed vLLM server with hs-connectors' FP8HiddenStatesConnector, vocab, `speculators train`, export;
             checks: the loss implementation `auto` chose and why, the exported aux ids, d2t/t2d, the hidden-state
             files (non-zero, equal to the transformers forward within tolerance, off-by-one ids far off);
  eval-code  one vLLM server per variant (baseline, trained, control) started once, spec decode (eagle3) measured
             at each concurrency in CURRENT_PROOF_CONCURRENCY: AL, per-position acceptance, output tokens/s; the
             baseline server also measures plain prefill (the extraction's samples, max_tokens 1): the cost of
             capturing and writing hidden states is the extraction's rate against this one;
  tiny-bf16  the tiny target through the same track with bf16 storage (vLLM's ExampleHiddenStatesConnector), then
             the evaluate stage itself (python -m specdec_pipeline.evaluate) with baseline and control drafts;
  fused      `speculators train --loss-implementation fused` on the code LM's data: must fail with the pipeline's
             one line naming eagle3_pipeline_loss_implementation (on the stack where fused is known to fail);
  code-bf16  the code LM's extraction again with bf16 storage at concurrency 32;
  train-sweep  `speculators train` again on code-fp8's extraction with each packing size and loader worker count of
             CURRENT_PROOF_TRAIN_SWEEP (total_seq_len:num_workers, comma separated): seconds, samples/s and the
             GPU's busy share during each run (what limits the trainer);
  kimi-fp8   the mini-Kimi (KIMI_TARGET: built by the pipeline's `build-tiny --shape kimi` with transformers 5.19 and
             carried along) through the same track in thinking mode: regenerate, extract (fp8, language model only),
             vocab, train, export, then the evaluate stage's own command - MLA and MoE through vLLM's CUDA kernels;
             the attention backend vLLM chose is read from the servers' logs. Skipped (not failed) without KIMI_TARGET.
Results: $CURRENT_PROOF_OUT/current_proof.json (rows and figures), written after every row.

Environment: CODE_LM (the code LM directory), CURRENT_PROOF_OUT, CURRENT_PROOF_DEVICE (cuda | cpu: a rehearsal
with vLLM's CPU build), CURRENT_PROOF_SAMPLES (400), CURRENT_PROOF_EPOCHS (3), CURRENT_PROOF_PROMPTS (64),
CURRENT_PROOF_MAX_TOKENS (128), CURRENT_PROOF_CONCURRENCY ("1,8,32"), CURRENT_PROOF_PHASES (all),
CURRENT_PROOF_DEADLINE_S (no limit), CURRENT_PROOF_SEQ (512), KIMI_TARGET (the mini-Kimi directory),
CURRENT_PROOF_EAGER (1: every server --enforce-eager; 0: CUDA graphs and torch.compile as vLLM defaults),
CURRENT_PROOF_TRAIN_SWEEP ("2048:2,16384:2,16384:8,65536:8"), CURRENT_PROOF_DRAFTS (the algorithms code-fp8 trains
from its one extraction, "eagle3"; "eagle3,dflash" adds a DFlash draft measured beside it), CURRENT_PROOF_DFLASH
("block_size:num_layers", "8:2"), CURRENT_PROOF_TOTAL_SEQ (training's packed row, 4 x CURRENT_PROOF_SEQ),
CURRENT_PROOF_LR (5e-4), CURRENT_PROOF_NGRAM (1: eval-code also measures vLLM's n-gram speculation, the free
baseline a trained draft has to beat).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.path.insert(1, str(ROOT))
sys.dont_write_bytecode = True

from specdec_pipeline import evaluate, evaluate_measure, metrics  # noqa: E402 - the package the role ships
from specdec_pipeline.serve import VllmServer, free_port  # noqa: E402
from tests.support import pipeline_cli  # noqa: E402 - the pipeline's command line, as every test runs it

OUT = Path(os.environ.get("CURRENT_PROOF_OUT", "gpu-proof-current")).resolve()
DEVICE = os.environ.get("CURRENT_PROOF_DEVICE", "cuda")
CODE_LM = Path(os.environ.get("CODE_LM", ROOT.parent / "shared" / "models" / "code-lm-16m")).resolve()
SAMPLES = int(os.environ.get("CURRENT_PROOF_SAMPLES", "400"))
EPOCHS = int(os.environ.get("CURRENT_PROOF_EPOCHS", "3"))
N_PROMPTS = int(os.environ.get("CURRENT_PROOF_PROMPTS", "64"))
MAX_TOKENS = int(os.environ.get("CURRENT_PROOF_MAX_TOKENS", "128"))
CONCURRENCY = [int(c) for c in os.environ.get("CURRENT_PROOF_CONCURRENCY", "1,8,32").split(",")]
PHASES = os.environ.get("CURRENT_PROOF_PHASES",
                        "code-fp8,eval-code,train-sweep,fused,tiny-bf16,code-bf16,kimi-fp8").split(",")
KIMI_TARGET = Path(os.environ["KIMI_TARGET"]).resolve() if os.environ.get("KIMI_TARGET") else None
KIMI_IDS = [2, 4, 5, 8]  # capture ids of the mini-Kimi's 8 text layers (inventory/local-kimi's)
DEADLINE = float(os.environ.get("CURRENT_PROOF_DEADLINE_S", "0")) or None
SEQ = int(os.environ.get("CURRENT_PROOF_SEQ", "512"))
EAGER = os.environ.get("CURRENT_PROOF_EAGER", "1") == "1"
TRAIN_SWEEP = [tuple(int(x) for x in v.split(":")) for v in
               os.environ.get("CURRENT_PROOF_TRAIN_SWEEP", "2048:2,16384:2,16384:8,65536:8").split(",") if v]
DRAFTS = [a for a in os.environ.get("CURRENT_PROOF_DRAFTS", "eagle3").split(",") if a]
DFLASH_BLOCK, DFLASH_LAYERS = (int(x) for x in os.environ.get("CURRENT_PROOF_DFLASH", "8:2").split(":"))
TOTAL_SEQ = int(os.environ.get("CURRENT_PROOF_TOTAL_SEQ", "0")) or 4 * SEQ
LR = float(os.environ.get("CURRENT_PROOF_LR", "5e-4"))
NGRAM = os.environ.get("CURRENT_PROOF_NGRAM", "1") == "1"
CODE_IDS = [1, 3, 4, 6]  # vLLM capture ids of the 6-layer code LM (6 = the final layer's output)
T0 = time.monotonic()
state: dict = {"date": time.strftime("%Y-%m-%d"), "device": DEVICE, "rows": [], "figures": {}, "phases": {}}


# -- recording ---------------------------------------------------------------------------------------------
def save() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / "current_proof.json.tmp"
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(OUT / "current_proof.json")


def record(check: str, ok: bool, detail: str) -> bool:
    state["rows"].append([check, "PASS" if ok else "FAIL", detail])
    print(f"[{'PASS' if ok else 'FAIL'}] {check}: {detail}", flush=True)
    save()
    return ok


def figure(key: str, value) -> None:
    state["figures"][key] = value
    print(f"[FIGURE] {key}: {value}", flush=True)
    save()


def elapsed() -> float:
    return round(time.monotonic() - T0, 1)


# -- the pipeline and its files ------------------------------------------------------------------------------
def pipeline(args: list, log_name: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    # COLUMNS: speculators' rich log lines unwrapped
    env = pipeline_cli.environment(keep_pythonpath=True, PYTHONUNBUFFERED="1", COLUMNS="400")
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    with open(OUT / "logs" / f"{log_name}.stderr", "w") as err:
        proc = pipeline_cli.run(*args, env=env, stdout=subprocess.PIPE, stderr=err, timeout=timeout)
    proc.stderr = (OUT / "logs" / f"{log_name}.stderr").read_text(errors="replace")
    return proc


def write_cfg(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=1))
    return path


def manifest(run: Path, step: str) -> dict:
    return json.loads((run / "manifests" / f"{step}.json").read_text())


def error_line(stderr: str, limit: int | None = 400) -> str:
    """The last ERROR line of STDERR (else its last non-empty line), cut to LIMIT characters for the table."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("ERROR")]
    return (lines or [ln for ln in stderr.splitlines() if ln.strip()][-1:] or ["(no output)"])[-1][:limit]


def base_cfg(run: Path, target: Path, data: Path, storage: str, concurrency: int, **over) -> dict:
    cfg = {"run_dir": str(run), "track": "current", "target": {"path": str(target), "trust_remote_code": False},
           "dataset": {"source": str(data), "max_samples": SAMPLES, "heldout": 0},
           "seq_length": SEQ,
           "extract": {"dtype": "bfloat16", "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.5},
           "vocab": {"draft_vocab_size": 2048},
           "train": {"epochs": EPOCHS, "lr": LR, "total_seq_len": TOTAL_SEQ, "seed": 0},
           "current": {"device": DEVICE, "hs_storage": storage, "concurrency": concurrency, "enforce_eager": EAGER,
                       "num_workers": 2, "ready_timeout_s": 900, "cpu_kvcache_gib": 2}}
    for key, value in over.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def extraction_window(run: Path) -> dict:
    """The request phase of the extract step, from pipeline.log's progress lines and finished.jsonl (in order of
    completion): tokens, bytes and seconds from the first finished sample to the last (server start excluded)."""
    stamps = []
    for line in (run / "logs" / "pipeline.log").read_text().splitlines():
        m = re.match(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ INFO extract: (\d+)/(\d+) samples", line)
        if m:
            stamps.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(m.group(2))))
    done = [json.loads(x) for x in (run / "extract" / "finished.jsonl").read_text().splitlines() if x.strip()]
    first = next(t for t, n in stamps if n >= 1)
    last = stamps[-1][0]
    tokens = sum(r["tokens"] for r in done[1:])
    size = sum(r["size"] for r in done[1:])
    secs = max(last - first, 1e-6)
    return {"samples": len(done), "tokens_after_first": tokens, "bytes_after_first": size, "seconds": round(secs, 3),
            "tokens_per_s": round(tokens / secs, 1), "bytes_per_s": round(size / secs, 1),
            "window": [first, last]}


def gpu_util(window) -> dict | None:
    path = OUT / "logs" / "gpu-util.csv"
    if not path.exists():
        return None
    vals = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if window[0] <= t <= window[1]:
                vals.append(float(parts[1]))
        except (ValueError, IndexError):
            continue
    return {"mean_util_pct": round(sum(vals) / len(vals), 1), "max_util_pct": max(vals), "samples": len(vals)} if vals else None


def hf_compare(target: Path, run: Path, ids: list, storage: str, n_files: int = 4) -> None:
    """Hidden-state files against the transformers forward: id k < n is the input of decoder layer k, id n the
    final layer's output (before the final norm); ids one lower must be far off."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    from specdec_pipeline.tracks.current.backends.server import load_hidden_states  # noqa: PLC0415

    hs_dir = run / "extract" / "hidden_states"
    files = sorted(hs_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    sizes = [p.stat().st_size for p in files]
    zero = [p.name for p in files if p.stat().st_size == 0]
    record(f"{run.name}: hidden-state files written and non-zero", bool(files) and not zero,
           f"{len(files)} files, {sum(sizes) / 1e6:.1f} MB, smallest {min(sizes) if sizes else 0} B"
           + (f"; empty: {zero[:5]}" if zero else ""))
    dev = "cuda" if DEVICE == "cuda" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.bfloat16).to(dev).eval()
    layers = model.model.layers
    n = len(layers)
    worst, worst_off, nonzero = 0.0, 1e9, True
    for path in files[:: max(1, len(files) // n_files)][:n_files]:
        data = load_hidden_states(path)
        hs = data["hidden_states"].float()  # [tokens, len(ids), hidden]
        nonzero &= bool(hs.abs().sum(dim=-1).min() > 0)
        cap = {}

        def pre(k):
            def hook(_m, args, kwargs):
                cap[k] = (args[0] if args else kwargs["hidden_states"]).detach()
            return hook

        def post(_m, _args, out):
            cap[n] = (out[0] if isinstance(out, tuple) else out).detach()

        handles = [layers[k].register_forward_pre_hook(pre(k), with_kwargs=True) for k in range(n)]
        handles.append(layers[n - 1].register_forward_hook(post))
        with torch.no_grad():
            model(data["token_ids"].unsqueeze(0).to(dev))
        for h in handles:
            h.remove()

        def rel(k, i):
            ref = cap[k][0].float().cpu()
            return float((hs[:, i] - ref).norm() / ref.norm().clamp_min(1e-12))

        worst = max(worst, *(rel(k, i) for i, k in enumerate(ids)))
        worst_off = min(worst_off, *(rel(k - 1, i) for i, k in enumerate(ids)))
    tol = 0.08 if storage == "fp8" else 0.03
    record(f"{run.name}: hidden states equal the transformers forward ({storage})",
           nonzero and worst < tol and worst_off > 0.2,
           f"ids {ids}: max relative error {worst:.2e} (tolerance {tol}); at ids-1 {worst_off:.2e} (must be > 0.2); "
           f"every row non-zero: {nonzero}")
    figure(f"{run.name}.hf_relative_error", {"at_ids": round(worst, 5), "at_ids_minus_one": round(worst_off, 4)})
    del model


def check_export(run: Path, ids: list) -> None:
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    from specdec_pipeline import tracks, vocab  # noqa: PLC0415

    conf = json.loads((run / "export" / "config.json").read_text())
    record(f"{run.name}: exported eagle_aux_hidden_state_layer_ids", conf.get("eagle_aux_hidden_state_layer_ids") == ids[:-1],
           f"capture ids {ids} -> exported {conf.get('eagle_aux_hidden_state_layer_ids')} (vLLM's convention: the "
           "capture ids minus the final layer)")
    d2t_ref, t2d_ref = vocab.load(tracks.load(run.parent / f"{run.name}.json"))
    with safe_open(str(run / "export" / "model.safetensors"), framework="pt") as f:
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    record(f"{run.name}: exported d2t/t2d equal the vocab step's", torch.equal(d2t, d2t_ref.to(d2t.dtype))
           and torch.equal(t2d, t2d_ref.to(t2d.dtype)) and int(t2d.sum()) == conf["draft_vocab_size"],
           f"d2t {tuple(d2t.shape)} {d2t.dtype}, t2d {tuple(t2d.shape)} {t2d.dtype}, {int(t2d.sum())} selected")


def train_figures(run: Path, step: str = "train") -> None:
    tr = manifest(run, step)
    text = (run / "logs" / f"{step}.log").read_text(errors="replace")
    steps = [int(s) for s in re.findall(r"global_step=(\d+)", text)]
    vals = dict(re.findall(r"(val/[\w/.]*acc[\w/.]*)=([-\d.e+]+)", text))
    n_train = int(manifest(run, "extract")["counts"]["samples"] * 0.9)
    secs = tr["seconds"]
    figure(f"{run.name}.{step}", {
        "seconds": round(secs, 1), "epochs": tr["counts"]["epochs"], "steps": (max(steps) + 1) if steps else None,
        "steps_per_s": round((max(steps) + 1) / secs, 3) if steps else None,
        "samples_per_s": round(n_train * tr["counts"]["epochs"] / secs, 2),
        "total_seq_len": TOTAL_SEQ, "lr": LR,
        "loss_implementation": tr["counts"].get("loss_implementation"),
        "loss_implementation_why": tr["counts"].get("loss_implementation_why"),
        "draft_attn_impl": tr["counts"].get("draft_attn_impl"), "last_val_accuracy": vals,
        "gpu": gpu_util([tr["finished"] - secs, tr["finished"]]) if tr.get("finished") else None})


# -- phases ------------------------------------------------------------------------------------------------------
def phase_code_fp8() -> None:
    run = OUT / "code-fp8"
    cfg = write_cfg(OUT / "code-fp8.json",
                    base_cfg(run, CODE_LM, OUT / "code-conversations.jsonl", "fp8", 8, extract={"layer_ids": CODE_IDS},
                             drafts=DRAFTS, dflash={"block_size": DFLASH_BLOCK, "num_layers": DFLASH_LAYERS,
                                                    "max_anchors": min(512, TOTAL_SEQ), "non_causal": False}))
    started = time.monotonic()
    proc = pipeline([cfg, "run"], "code-fp8")
    ok = record("code-fp8: pipeline prepare -> extract (fp8, server-side) -> vocab -> train -> export",
                proc.returncode == 0, f"{time.monotonic() - started:.0f} s; " + (proc.stdout.strip().splitlines()[-1][:300]
                                                                                 if proc.returncode == 0 else error_line(proc.stderr)))
    if not ok:
        return
    for step in ("prepare", "extract", "vocab", "train", "export"):
        figure(f"code-fp8.{step}_seconds", round(manifest(run, step)["seconds"], 1))
    ext = manifest(run, "extract")["counts"]
    figure("code-fp8.extract", {k: ext[k] for k in ("samples", "tokens", "bytes", "bytes_per_token", "hs_storage")})
    win = extraction_window(run)
    figure("code-fp8.extract_window", {**win, "gpu": gpu_util(win["window"])})
    tr = manifest(run, "train")["counts"]
    want = "eager" if DEVICE == "cuda" else "eager"
    record("code-fp8: loss implementation decided from the stack and recorded", tr.get("loss_implementation") == want
           and bool(tr.get("loss_implementation_why")), f"{tr.get('loss_implementation')}: {tr.get('loss_implementation_why')}")
    record("code-fp8: train ran `speculators train` on the device", tr.get("trainer") == "speculators train"
           and tr.get("epochs") == EPOCHS, f"{tr.get('epochs')} epochs, attention {tr.get('draft_attn_impl')}")
    train_figures(run)
    for algo in DRAFTS:
        if algo != "eagle3":
            figure(f"code-fp8.train-{algo}_seconds", round(manifest(run, f"train-{algo}")["seconds"], 1))
            train_figures(run, f"train-{algo}")
            figure(f"code-fp8.export-{algo}", manifest(run, f"export-{algo}")["counts"])
    check_export(run, CODE_IDS)
    hf_compare(CODE_LM, run, CODE_IDS, "fp8")


def _timed(srv, cfg, prompt):
    out = evaluate_measure._request(srv, cfg, prompt)
    out["done_at"] = time.monotonic()
    return out


def run_batch(srv, cfg, prompts, conc) -> dict:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=conc) as pool:
        done = list(pool.map(lambda p: _timed(srv, cfg, p), prompts))
    wall = time.monotonic() - started
    return {"done": done, "wall": wall}


def sweep(ev_cfg: dict, variant: str, draft, prompts: list, prefill: list | None = None, method: str = "eagle3",
          tokens: int | None = None, spec: dict | None = None) -> dict:
    """One server for VARIANT, measured at every concurrency (and plain prefill on the baseline): DRAFT served with
    METHOD and TOKENS draft tokens, or SPEC as the whole speculative config (n-gram: no draft model)."""
    port = free_port()
    ev_cfg = {**ev_cfg, "port": port}
    log_path = OUT / "logs" / f"serve-{variant}.log"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", **ev_cfg["server_env"]}
    res: dict = {}
    argv = evaluate_measure.server_argv(ev_cfg, draft, method=method, tokens=tokens)
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    with VllmServer(argv, host="127.0.0.1", port=port, env=env, log_path=log_path,
                    ready_timeout_s=900, name=f"vLLM server ({variant})") as srv:
        res["server_startup_s"] = srv.startup_s
        for p in prompts[:2]:
            evaluate_measure._request(srv, ev_cfg, p)  # warm-up
        for conc in CONCURRENCY:
            subset = prompts[: max(16, 2 * conc)]
            before = metrics.spec_decode(srv.metrics())
            batch = run_batch(srv, ev_cfg, subset, conc)
            after = metrics.spec_decode(srv.metrics())
            tokens = sum(d["tokens"] for d in batch["done"])
            row = {"requests": len(subset), "output_tokens": tokens, "seconds": round(batch["wall"], 3),
                   "output_tokens_per_s": round(tokens / batch["wall"], 1)}
            if draft or spec:
                row["spec_decode_counters"] = after["present"]
                if after["present"]:
                    row.update(metrics.summarise(metrics.delta(after, before)))
            res[f"c{conc}"] = row
            print(f"  {variant} c={conc}: {row}", flush=True)
        if prefill:
            pcfg = {**ev_cfg, "max_tokens": 1, "ignore_eos": False}
            for conc in (8, 32):
                batch = run_batch(srv, pcfg, prefill, conc)
                order = sorted(batch["done"], key=lambda d: d["done_at"])
                toks = [len(p["prompt"]) for p in prefill]
                secs = order[-1]["done_at"] - order[0]["done_at"]
                res[f"prefill_c{conc}"] = {"requests": len(prefill), "tokens": sum(toks),
                                           "seconds_after_first": round(secs, 3),
                                           "tokens_per_s": round((sum(toks) - toks[0]) / max(secs, 1e-6), 1),
                                           "tokens_per_s_whole": round(sum(toks) / batch["wall"], 1)}
                print(f"  prefill c={conc}: {res[f'prefill_c{conc}']}", flush=True)
    return res


def eval_server_args(max_len: int) -> list:
    args = ["--max-model-len", str(max_len), "--no-enable-prefix-caching", "--max-num-batched-tokens", "8192"]
    if EAGER:
        args.append("--enforce-eager")
    if DEVICE == "cuda":
        return args + ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"]
    return args + ["--dtype", "float32"]


def phase_eval_code() -> None:
    run = OUT / "code-fp8"
    if not (run / "export" / "model.safetensors").exists():
        record("eval-code: the export exists", False, "code-fp8 did not export a draft")
        return
    held = [json.loads(x) for x in (CODE_LM / "heldout_prompts.jsonl").read_text().splitlines() if x.strip()]
    from transformers import AutoTokenizer  # noqa: PLC0415

    from specdec_pipeline import chatmode  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(str(CODE_LM))
    # rendered as the evaluate stage renders a prompt given as messages (prompt_sets: token ids, instant mode)
    prompts = [{"prompt": chatmode.prompt_ids(tok, [{"role": "user", "content": r["prompt"]}], "instant"),
                "source": r["id"]} for r in held[:N_PROMPTS]]
    samples = [json.loads(x) for x in (run / "prepare" / "samples.jsonl").read_text().splitlines() if x.strip()]
    prefill = [{"prompt": s["input_ids"], "source": f"sample:{s['id']}"} for s in samples]
    ev_cfg = {**evaluate.DEFAULTS, "run_dir": str(run), "target": str(CODE_LM), "python": sys.executable,
              "server_args": eval_server_args(1024), "server_env": {"VLLM_CPU_KVCACHE_SPACE": "2"} if DEVICE == "cpu" else {},
              "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "num_speculative_tokens": 3}
    control = evaluate_measure.build_control_draft(run / "export", OUT / "code-control-draft", 0)
    results = {}
    # (name, draft, plain prefill, method, draft tokens, whole speculative config): the baseline and EAGLE-3 first,
    # then the free n-gram speculation, the other algorithms, the controls last (they prove learning, not speed)
    variants = [("baseline", None, prefill, "eagle3", None, None), ("trained", run / "export", None, "eagle3", None, None)]
    if NGRAM:
        variants.append(("ngram", None, None, "ngram", None,
                         {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}))
    others = [a for a in DRAFTS if a != "eagle3" and (run / f"export-{a}" / "model.safetensors").exists()]
    for algo in others:
        toks = DFLASH_BLOCK if algo == "dspark" else DFLASH_BLOCK - 1
        variants.append((algo, run / f"export-{algo}", None, algo, toks, None))
    variants.append(("control", control, None, "eagle3", None, None))
    for algo in others:
        toks = DFLASH_BLOCK if algo == "dspark" else DFLASH_BLOCK - 1
        ctl = evaluate_measure.build_control_draft(run / f"export-{algo}", OUT / f"code-control-{algo}", 0)
        variants.append((f"{algo}-control", ctl, None, algo, toks, None))
    for variant, draft, pre, method, toks, spec in variants:
        if DEADLINE and elapsed() > DEADLINE:
            record(f"eval-code: {variant}", False, f"not measured: the deadline ({DEADLINE:g} s) passed")
            continue
        try:
            results[variant] = sweep(ev_cfg, variant, draft, prompts, pre, method=method, tokens=toks, spec=spec)
        except Exception as exc:  # noqa: BLE001 - one line per failed variant, the next one still runs
            record(f"eval-code: {variant} served and measured", False, f"{type(exc).__name__}: {str(exc)[:300]}")
        figure("eval-code", results)
    for algo in others:
        got, ctl = results.get(algo), results.get(f"{algo}-control")
        if got and ctl:
            c1 = f"c{CONCURRENCY[0]}"
            record(f"eval-code: the {algo} draft's AL is above its control's",
                   (got[c1].get("acceptance_length") or 1.0) > (ctl[c1].get("acceptance_length") or 1.0),
                   f"{got[c1].get('acceptance_length')} vs {ctl[c1].get('acceptance_length')}")
    tr, co, base = results.get("trained"), results.get("control"), results.get("baseline")
    c1 = f"c{CONCURRENCY[0]}"
    if tr:
        record("eval-code: vLLM loads the trained draft and drafts with it (spec-decode counters)",
               all(tr[f"c{c}"].get("spec_decode_counters") and (tr[f"c{c}"].get("drafts") or 0) > 0 for c in CONCURRENCY),
               f"AL {tr[c1].get('acceptance_length')} at concurrency {CONCURRENCY[0]}, drafts {tr[c1].get('drafts')}")
    if tr and co:
        al_t, al_c = tr[c1].get("acceptance_length") or 1.0, co[c1].get("acceptance_length") or 1.0
        record("eval-code: the trained draft's AL is above the control's", al_t > al_c,
               f"trained {al_t} vs control {al_c} (per position {tr[c1].get('per_position')} vs {co[c1].get('per_position')})")
    if base:
        figure("eval-code.speedup", {v: {f"c{c}": round(r[f"c{c}"]["output_tokens_per_s"] / base[f"c{c}"]["output_tokens_per_s"], 3)
                                         for c in CONCURRENCY if f"c{c}" in r}
                                     for v, r in results.items() if v != "baseline"})
    if base and (run / "extract" / "finished.jsonl").exists():
        win = state["figures"].get("code-fp8.extract_window")
        if win:
            figure("code-fp8.extract_vs_prefill_c8", round(win["tokens_per_s"] / base["prefill_c8"]["tokens_per_s"], 3))


def eval_python() -> str:
    """The interpreter the evaluate stage is given. The stage asks it which vLLM it has with `python -I` (as of an
    evaluation venv, where vLLM is installed); here vLLM and the wheels sit on PYTHONPATH (run-current.sh), which
    -I ignores: a venv over this interpreter whose .pth names those folders answers as an installed one would."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_dir()]
    if not extra:
        return sys.executable
    # this interpreter may itself be a venv (torch lives there): its site folders too, after the carried ones
    extra += [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and p not in extra]
    venv = OUT / "eval-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "specdec-gpu-proof.pth").write_text("".join(f"{p}\n" for p in extra))
    return str(py)


def run_evaluate(ev: Path, log_name: str, timeout: float) -> subprocess.CompletedProcess:
    """The evaluate stage's own command on the evaluation config EV; its stderr kept in logs/LOG_NAME.stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FILES), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "specdec_pipeline.evaluate", str(ev), "run"], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    (OUT / "logs" / f"{log_name}.stderr").write_text(proc.stderr)
    return proc


def phase_tiny_bf16() -> None:
    target = OUT / "tiny-target"
    dataset = FILES / "tiny_conversations.jsonl"
    proc = pipeline([dataset, "build-tiny", "--out", target, "--shape", "heads=1,kv_heads=1"], "tiny-build", 600)
    if not record("tiny-bf16: build the tiny target (head size 64)", proc.returncode == 0, error_line(proc.stderr)):
        return
    run = OUT / "tiny-bf16"
    cfg = write_cfg(OUT / "tiny-bf16.json", base_cfg(
        run, target, dataset, "bf16", 8, dataset={"source": str(dataset), "max_samples": 48, "heldout": 8},
        seq_length=256, vocab={"draft_vocab_size": 128},
        train={"epochs": EPOCHS, "lr": 1e-3, "total_seq_len": 512, "seed": 0}))
    started = time.monotonic()
    proc = pipeline([cfg, "run"], "tiny-bf16")
    if not record("tiny-bf16: pipeline prepare -> extract (bf16, server-side) -> vocab -> train -> export",
                  proc.returncode == 0, f"{time.monotonic() - started:.0f} s; " + error_line(proc.stderr)):
        return
    ids = json.loads((run / "extract" / "data_config.json").read_text())["layer_ids"]
    ext = manifest(run, "extract")["counts"]
    figure("tiny-bf16.extract", {k: ext[k] for k in ("samples", "tokens", "bytes", "bytes_per_token", "hs_storage")})
    train_figures(run)
    check_export(run, ids)
    hf_compare(target, run, ids, "bf16")
    ev = write_cfg(OUT / "tiny-evaluate.json", {
        "run_dir": str(run), "target": str(target), "python": eval_python(), "server_args": eval_server_args(512),
        "server_env": {"VLLM_CPU_KVCACHE_SPACE": "1"} if DEVICE == "cpu" else {}, "ready_timeout_s": 900,
        "prompt_sets": ["heldout"], "max_prompts": 8, "max_tokens": 64, "concurrency": [1],
        "baseline": os.environ.get("CURRENT_PROOF_TINY_BASELINE", "1") == "1", "control": True})
    if DEADLINE and elapsed() > DEADLINE + 120:
        record("tiny-bf16: the evaluate stage", False, f"not run: {elapsed()} s is past the deadline")
        return
    proc = run_evaluate(ev, "tiny-evaluate", 1200)
    ok = record("tiny-bf16: the evaluate stage serves the export with spec decode (baseline, trained, control)",
                proc.returncode == 0, (proc.stdout.strip().splitlines() or [error_line(proc.stderr)])[-1][:400])
    if ok:
        res = json.loads((run / "evaluate" / "results.json").read_text())
        keys = ("acceptance_length", "per_position", "output_tokens_per_s", "server_startup_s")
        held = res["sets"]["heldout"]
        figure("tiny-bf16.evaluate", {v: {k: r.get(k) for k in keys} | {"output_tokens_per_s": r["by_concurrency"]["1"][
            "output_tokens_per_s"]} for v, r in held["variants"].items()} | {"speedup": held["speedup"]})


def phase_fused() -> None:
    src = OUT / "code-fp8"
    if not (src / "manifests" / "vocab.json").exists():
        record("fused: the code-fp8 run's data exists", False, "code-fp8 did not get past vocab")
        return
    run = OUT / "code-fused"
    if run.exists():
        shutil.rmtree(run)
    subprocess.run(["cp", "-al", str(src), str(run)], check=True)  # hard links: the data, not a copy of it
    for rel in ("train", "export", "manifests/train.json", "manifests/export.json", "logs", "progress.json"):
        p = run / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    cfg = json.loads((OUT / "code-fp8.json").read_text())
    cfg["run_dir"] = str(run)
    cfg["current"]["loss_implementation"] = "fused"
    cfg["train"]["epochs"] = 1
    path = write_cfg(OUT / "code-fused.json", cfg)
    started = time.monotonic()
    proc = pipeline([path, "run", "--until", "train"], "code-fused", 420)
    line = error_line(proc.stderr, None)  # the whole line: what it names sits at its end
    text = (run / "logs" / "train.log").read_text(errors="replace") if (run / "logs" / "train.log").exists() else ""
    (OUT / "logs" / "fused-train.log").write_text(text[-200000:])
    reran = re.findall(r"(prepare|extract|vocab): running", proc.stderr)
    if proc.returncode == 0:
        record("fused: --loss-implementation fused on this stack", True,
               f"trained without error in {time.monotonic() - started:.0f} s: fused works here (record it as proven)")
        return
    record("fused: a failed first step is one line naming eagle3_pipeline_loss_implementation and the log",
           "eagle3_pipeline_loss_implementation" in line and "first training step" in line and "train.log" in line
           and len([x for x in proc.stderr.splitlines() if x.startswith("ERROR")]) == 1 and "Traceback" not in proc.stderr,
           f"{time.monotonic() - started:.0f} s (steps re-run: {reran or 'none'}): {line[:200]} ... {line[-160:]}")


def phase_code_bf16() -> None:
    run = OUT / "code-bf16"
    cfg = write_cfg(OUT / "code-bf16.json",
                    base_cfg(run, CODE_LM, OUT / "code-conversations.jsonl", "bf16", 32, extract={"layer_ids": CODE_IDS}))
    proc = pipeline([cfg, "run", "--until", "extract"], "code-bf16")
    if not record("code-bf16: prepare -> extract (bf16, server-side, concurrency 32)", proc.returncode == 0,
                  error_line(proc.stderr)):
        return
    ext = manifest(run, "extract")["counts"]
    figure("code-bf16.extract", {k: ext[k] for k in ("samples", "tokens", "bytes", "bytes_per_token", "hs_storage")}
           | {"seconds": round(manifest(run, "extract")["seconds"], 1)})
    win = extraction_window(run)
    figure("code-bf16.extract_window", {**win, "gpu": gpu_util(win["window"])})
    base = (state["figures"].get("eval-code") or {}).get("baseline")
    if base:
        figure("code-bf16.extract_vs_prefill_c32", round(win["tokens_per_s"] / base["prefill_c32"]["tokens_per_s"], 3))
    hf_compare(CODE_LM, run, CODE_IDS, "bf16")


# -- machine ---------------------------------------------------------------------------------------------------
def phase_train_sweep() -> None:
    """`speculators train` on code-fp8's extraction at each (total_seq_len, num_workers) of TRAIN_SWEEP."""
    run = OUT / "code-fp8"
    if not (run / "extract" / "finished.jsonl").exists():
        record("train-sweep: code-fp8's extraction exists", False, "code-fp8 did not extract")
        return
    rows = {}
    for packed, workers in TRAIN_SWEEP:
        if DEADLINE and elapsed() > DEADLINE:
            record(f"train-sweep: {packed}:{workers}", False, f"not measured: the deadline ({DEADLINE:g} s) passed")
            continue
        cfg = base_cfg(run, CODE_LM, OUT / "code-conversations.jsonl", "fp8", 8, extract={"layer_ids": CODE_IDS},
                       train={"total_seq_len": packed}, current={"num_workers": workers})
        path = write_cfg(OUT / f"train-{packed}-{workers}.json", cfg)
        t0 = time.time()
        proc = pipeline([path, "run", "--until", "train"], f"train-{packed}-{workers}")
        t1 = time.time()
        if not record(f"train-sweep: total_seq_len {packed}, num_workers {workers} trains", proc.returncode == 0,
                      f"{t1 - t0:.0f} s" if proc.returncode == 0 else error_line(proc.stderr)):
            continue
        tr = manifest(run, "train")
        n_train = int(manifest(run, "extract")["counts"]["samples"] * 0.9)
        rows[f"{packed}:{workers}"] = {"seconds": round(tr["seconds"], 1), "epochs": tr["counts"]["epochs"],
                                       "samples_per_s": round(n_train * tr["counts"]["epochs"] / tr["seconds"], 2),
                                       "gpu": gpu_util([t1 - tr["seconds"], t1])}
        figure("train-sweep", rows)


def backend_lines(run: Path) -> dict:
    """{log name: the lines of the run's server logs that name the attention backend vLLM chose (MLA on Kimi)}."""
    out = {}
    for log in sorted((run / "logs").glob("*.log")):
        hits = [ln.strip()[-200:] for ln in log.read_text(errors="replace").splitlines()
                if re.search(r"MLA|[Aa]ttention backend|Using \w+ backend", ln)]
        if hits:
            out[log.name] = hits[:3]
    return out


def phase_kimi_fp8() -> None:
    target = KIMI_TARGET
    if not (target / "config.json").is_file():
        record("kimi-fp8: the mini-Kimi target", False, f"{target}/config.json is missing")
        return
    dataset = FILES / "tiny_conversations.jsonl"
    run = OUT / "kimi-fp8"
    cfg = base_cfg(run, target, dataset, "fp8", 8, dataset={"source": str(dataset), "max_samples": 48, "heldout": 8},
                   seq_length=256, chat_mode="thinking",
                   regenerate={"enabled": True, "max_tokens": 64, "keep_truncated": True, "temperature": 0.0},
                   extract={"layer_ids": KIMI_IDS, "max_num_batched_tokens": 4096}, vocab={"draft_vocab_size": 128},
                   train={"epochs": EPOCHS, "lr": 1e-3, "total_seq_len": 512, "seed": 0},
                   current={"language_model_only": True})
    cfg["target"]["trust_remote_code"] = True  # the checkpoint's own code, as the real one ships it
    cfg = write_cfg(OUT / "kimi-fp8.json", cfg)
    started = time.monotonic()
    proc = pipeline([cfg, "run"], "kimi-fp8")
    ok = record("kimi-fp8: mini-Kimi regenerate (thinking) -> prepare -> extract (fp8, language model only) -> vocab "
                "-> train -> export", proc.returncode == 0,
                f"{time.monotonic() - started:.0f} s; " + error_line(proc.stderr))
    figure("kimi-fp8.backends", backend_lines(run))
    if not ok:
        return
    reg = manifest(run, "regenerate")
    figure("kimi-fp8.regenerate", {"counts": reg["counts"], "sampling": reg["regenerate"].get("sampling"),
                                   "chat_mode": reg["regenerate"].get("chat_mode")})
    for step in ("regenerate", "prepare", "extract", "vocab", "train", "export"):
        figure(f"kimi-fp8.{step}_seconds", round(manifest(run, step)["seconds"], 1))
    ext = manifest(run, "extract")["counts"]
    figure("kimi-fp8.extract", {k: ext[k] for k in ("samples", "tokens", "bytes", "bytes_per_token", "hs_storage")})
    win = extraction_window(run)
    figure("kimi-fp8.extract_window", {**win, "gpu": gpu_util(win["window"])})
    train_figures(run)
    check_export(run, KIMI_IDS)
    ev = write_cfg(OUT / "kimi-evaluate.json", {
        "run_dir": str(run), "target": str(target), "python": eval_python(), "trust_remote_code": True,
        "server_args": ["--trust-remote-code", "--language-model-only", *eval_server_args(512)],
        "ready_timeout_s": 900, "chat_mode": "thinking", "prompt_sets": ["heldout"], "max_prompts": 8,
        "max_tokens": 64, "concurrency": [1, 8], "baseline": True, "control": True})
    proc = run_evaluate(ev, "kimi-evaluate", 1500)
    ok = record("kimi-fp8: the evaluate stage serves the mini-Kimi with the export as its EAGLE-3 draft (baseline, "
                "trained, control)", proc.returncode == 0,
                (proc.stdout.strip().splitlines() or [error_line(proc.stderr)])[-1][:400])
    figure("kimi-fp8.backends", backend_lines(run))
    if ok:
        res = json.loads((run / "evaluate" / "results.json").read_text())
        held = res["sets"]["heldout"]
        figure("kimi-fp8.evaluate", {"settings": res["settings"], "vllm": res["vllm"], "speedup": held["speedup"],
                                     "variants": held["variants"]})
        tr = held["variants"]["trained"]
        record("kimi-fp8: vLLM drafts with the export on the mini-Kimi (spec-decode counters)",
               (tr["by_concurrency"]["1"].get("drafts") or 0) > 0,
               f"AL trained {tr['acceptance_length']} vs control {held['variants']['control']['acceptance_length']} "
               "(random weights: the path, not a gain)")


def machine() -> None:
    import importlib.metadata as md  # noqa: PLC0415

    import torch  # noqa: PLC0415

    info = {"python": sys.version.split()[0], "commit": os.environ.get("CURRENT_PROOF_COMMIT", "")}
    for dist in ("vllm", "vllm-cpu", "torch", "transformers", "speculators", "hs-connectors", "triton", "flashinfer-python"):
        try:
            info[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        info["gpu"] = f"{torch.cuda.get_device_name(0)} cc {'.'.join(map(str, torch.cuda.get_device_capability(0)))}"
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        info["driver"] = smi.stdout.strip()
    figure("machine", info)
    # the disk's write rate where the hidden states go: 1 GiB, fsync'd
    OUT.mkdir(parents=True, exist_ok=True)
    probe = OUT / "disk-probe.bin"
    block = os.urandom(16 << 20)
    started = time.monotonic()
    with open(probe, "wb") as f:
        for dummy in range(64):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    secs = time.monotonic() - started
    probe.unlink()
    figure("disk_write", {"bytes": 64 * (16 << 20), "seconds": round(secs, 3), "bytes_per_s": round(64 * (16 << 20) / secs, 1)})


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "logs").mkdir(exist_ok=True)
    # the code LM's conversations, minus nothing: prepare takes the first CURRENT_PROOF_SAMPLES
    shutil.copyfile(CODE_LM / "conversations.jsonl", OUT / "code-conversations.jsonl")
    sampler = None
    if shutil.which("nvidia-smi"):
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used",
                                    "--format=csv,noheader,nounits", "-lms", "500"],
                                   stdout=open(OUT / "logs" / "gpu-util.csv", "w"), stderr=subprocess.DEVNULL)
    try:
        machine()
        for name, fn in (("code-fp8", phase_code_fp8), ("eval-code", phase_eval_code), ("train-sweep", phase_train_sweep),
                         ("fused", phase_fused),
                         ("tiny-bf16", phase_tiny_bf16), ("code-bf16", phase_code_bf16), ("kimi-fp8", phase_kimi_fp8)):
            if name not in PHASES:
                continue
            if name == "kimi-fp8" and KIMI_TARGET is None:
                state["phases"][name] = "skipped: KIMI_TARGET is not set (tests/gpu/fetch-current carries it when given)"
                save()
                continue
            if DEADLINE and elapsed() > DEADLINE:
                state["phases"][name] = f"skipped at {elapsed()} s (deadline {DEADLINE:g} s)"
                save()
                continue
            started = elapsed()
            print(f"=== [{started:7.1f}s] phase {name}", flush=True)
            try:
                fn()
                state["phases"][name] = f"ran {started} -> {elapsed()} s"
            except Exception as exc:  # noqa: BLE001 - the next phase still runs; the traceback goes to the log
                traceback.print_exc()
                state["phases"][name] = f"error at {elapsed()} s: {type(exc).__name__}: {str(exc)[:300]}"
                record(f"{name}: phase completed", False, state["phases"][name])
            save()
    finally:
        if sampler:
            sampler.terminate()
    fails = [r for r in state["rows"] if r[1] == "FAIL"]
    state["result"] = "FAIL" if fails else "PASS"
    state["seconds"] = elapsed()
    save()
    print("\n" + "\n".join(f"{r[1]:5} {r[0]}: {r[2]}" for r in state["rows"]))
    print(f"result: {state['result']} ({len(fails)} failed) in {elapsed()} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
