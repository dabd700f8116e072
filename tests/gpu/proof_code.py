"""tests/gpu/current_proof.py's phases on the code LM: code-fp8 (the pipeline's current track, checked), eval-code
(one vLLM server per variant, measured at each concurrency, with its helpers), fused, code-bf16 and train-sweep."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import subprocess
import sys
import time

# proof_common first: importing it puts the role's files on sys.path (specdec_pipeline below)
from proof_common import (ATTN, CODE_IDS, CODE_LM, CONCURRENCY, DEADLINE, DEVICE, DFLASH_BLOCK, DFLASH_EPOCHS,
                          DFLASH_LAYERS, DRAFTS, EPOCHS, HELDOUT, MAX_TOKENS, N_PROMPTS, NGRAM, OUT, REGENERATE,
                          TOTAL_SEQ, TRAIN_SWEEP, base_cfg,
                          check_export, elapsed, error_line, eval_server_args, extraction_window, figure, gpu_util,
                          hf_compare, manifest, pipeline, record, state, train_figures, write_cfg)
from specdec_pipeline import evaluate, evaluate_measure, metrics  # the package the role ships
from specdec_pipeline.serve import VllmServer, free_port


def phase_code_fp8() -> None:
    run = OUT / "code-fp8"
    over = {}
    if REGENERATE:  # the replies written by the target itself, greedy as the evaluate stage measures
        over["regenerate"] = {"enabled": True, "max_tokens": REGENERATE, "keep_truncated": True, "temperature": 0.0,
                              "concurrency": 256}
    cfg = write_cfg(OUT / "code-fp8.json",
                    base_cfg(run, CODE_LM, OUT / "code-conversations.jsonl", "fp8", 8, extract={"layer_ids": CODE_IDS},
                             drafts=DRAFTS, dflash={"block_size": DFLASH_BLOCK, "num_layers": DFLASH_LAYERS,
                                                    "max_anchors": min(512, TOTAL_SEQ), "non_causal": False,
                                                    "epochs": DFLASH_EPOCHS},
                             dataset={"heldout": HELDOUT}, current={"draft_attn_impl": ATTN}, **over))
    started = time.monotonic()
    proc = pipeline([cfg, "run"], "code-fp8")
    ok = record("code-fp8: pipeline prepare -> extract (fp8, server-side) -> vocab -> train -> export",
                proc.returncode == 0, f"{time.monotonic() - started:.0f} s; " + (proc.stdout.strip().splitlines()[-1][:300]
                                                                                 if proc.returncode == 0 else error_line(proc.stderr)))
    if not ok:
        return
    for step in ("regenerate", "prepare", "extract", "vocab", "train", "export"):
        if (run / "manifests" / f"{step}.json").exists():
            figure(f"code-fp8.{step}_seconds", round(manifest(run, step)["seconds"], 1))
    figure("code-fp8.data", {"prepare": manifest(run, "prepare").get("counts"),
                             "regenerate": manifest(run, "regenerate").get("counts")
                             if (run / "manifests" / "regenerate.json").exists() else None})
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
