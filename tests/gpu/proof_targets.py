"""tests/gpu/current_proof.py's phases on targets other than the code LM: tiny-bf16 (the tiny target, bf16
storage) and kimi-fp8 (the mini-Kimi in thinking mode: MLA and MoE), each through the pipeline and the evaluate
stage."""

from __future__ import annotations

import json
import os
import time

from proof_common import (DEADLINE, DEVICE, EPOCHS, FILES, KIMI_IDS, KIMI_TARGET, OUT, backend_lines, base_cfg,
                          check_export, elapsed, error_line, eval_python, eval_server_args, extraction_window, figure,
                          gpu_util, hf_compare, manifest, pipeline, record, run_evaluate, train_figures, write_cfg)


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
