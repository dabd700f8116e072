"""Prove the GPU preflight and the training step on a real NVIDIA GPU, in one run.

What it does (each check raises on failure; the table of figures is printed last):
  1. the GPU check (roles/gpu_verify/files/gpu_check.py with plugins/module_utils/gpu_inventory.py, the logic
     behind specdec.eagle3.gpu_facts) against
     the real nvidia-smi: it must pass with the expected count/capability and fail, with its one sentence,
     when told to expect compute capability 12.0 (the production RTX PRO 6000 value);
  2. the pipeline on the tiny profile: build the tiny target, prepare, extract (transformers backend, bf16,
     on the GPU), vocab, train (speculators' real EAGLE-3 trainer under torchrun, FSDP bf16 mixed precision,
     FlexAttention) and export;
  3. loads the exported checkpoint back: layer ids in vLLM's convention, d2t/t2d, tensor shapes, and that the
     exported ids select in the target's own forward pass exactly the tensors the training data holds;
  4. reports extraction tokens/s and training steps/s.

Run it through tests/gpu/run.sh, which installs the carried wheels first.  Environment knobs:
  GPU_EXPECT_COUNT (default 1), GPU_EXPECT_CC (default 9.0), GPU_PROOF_EPOCHS (default 3),
  GPU_PROOF_OUT (default ./gpu-proof-out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
GPU_CLI = ROOT / "roles" / "gpu_verify" / "files" / "gpu_check.py"
sys.path.insert(0, str(ROOT))
from tests.support import pipeline_cli  # noqa: E402 - the pipeline's command line, as every test runs it
DATASET = FILES / "tiny_conversations.jsonl"
OUT = Path(os.environ.get("GPU_PROOF_OUT", "gpu-proof-out")).resolve()
EXPECT_COUNT = os.environ.get("GPU_EXPECT_COUNT", "1")
EXPECT_CC = os.environ.get("GPU_EXPECT_CC", "9.0")
EPOCHS = int(os.environ.get("GPU_PROOF_EPOCHS", "3"))

rows: list[tuple[str, str, str]] = []  # (check, result, detail)


def record(check: str, ok: bool, detail: str) -> None:
    rows.append((check, "PASS" if ok else "FAIL", detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {check}: {detail}", flush=True)
    if not ok:
        raise SystemExit(finish(1))


def finish(rc: int) -> int:
    width = max(len(r[0]) for r in rows) if rows else 10
    print("\n" + "=" * 100)
    print(f"{'check'.ljust(width)}  result  detail")
    for check, result, detail in rows:
        print(f"{check.ljust(width)}  {result.ljust(6)}  {detail}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gpu_proof.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return rc


def gpu_check() -> str:
    ok = subprocess.run([sys.executable, str(GPU_CLI), "--expect-count", EXPECT_COUNT, "--expect-cc", EXPECT_CC],
                        capture_output=True, text=True, check=False)
    print(ok.stdout + ok.stderr)
    record(f"gpu check expects {EXPECT_COUNT} x cc {EXPECT_CC}", ok.returncode == 0,
           (ok.stdout + ok.stderr).strip().splitlines()[-1])
    bad = subprocess.run([sys.executable, str(GPU_CLI), "--expect-count", EXPECT_COUNT, "--expect-cc", "12.0"],
                         capture_output=True, text=True, check=False)
    message = (bad.stdout + bad.stderr).strip().splitlines()[-1]
    record("gpu check expects cc 12.0 (must fail)", bad.returncode != 0 and "12.0" in message, message)
    return ok.stdout


def pipeline(*args: str) -> subprocess.CompletedProcess:
    proc = pipeline_cli.run(*args, env=pipeline_cli.environment(keep_pythonpath=True))
    sys.stdout.write(proc.stdout[-3000:])
    sys.stderr.write(proc.stderr[-6000:])
    return proc


def run_pipeline() -> tuple[Path, dict]:
    target = OUT / "tiny-target"
    proc = pipeline(str(DATASET), "build-tiny", "--out", str(target))
    record("build the tiny target", proc.returncode == 0, str(target))
    cfg = {
        "run_dir": str(OUT / "run"),
        "target": {"path": str(target)},
        "dataset": {"source": str(DATASET)},
        "seq_length": 256,
        "extract": {"backend": "transformers", "dtype": "bfloat16"},
        "vocab": {"draft_vocab_size": 128},
        "train": {"epochs": EPOCHS, "total_seq_len": 512, "lr": 1e-3, "device": "cuda", "nproc": 1,
                  "cpu_training": False},
    }
    cfg_path = OUT / "run.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    started = time.time()
    proc = pipeline(str(cfg_path), "run")
    summary = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    record("pipeline prepare -> extract -> vocab -> train -> export", proc.returncode == 0 and not summary.get("stopped"),
           f"ran {summary.get('ran')} in {time.time() - started:.1f} s")
    return cfg_path, summary


def manifest(run_dir: Path, step: str) -> dict:
    return json.loads((run_dir / "manifests" / f"{step}.json").read_text())


def check_export(cfg_path: Path, run_dir: Path, target: Path) -> None:
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    export = run_dir / "export"
    conf = json.loads((export / "config.json").read_text())
    data_cfg = json.loads((run_dir / "extract" / "data_config.json").read_text())
    capture = data_cfg["layer_ids"]
    want_ids = [k + 1 for k in capture[:-1]]
    record("export: eagle_aux_hidden_state_layer_ids in vLLM's convention",
           conf.get("eagle_aux_hidden_state_layer_ids") == want_ids,
           f"captured outputs of {capture[:-1]} -> exported {conf.get('eagle_aux_hidden_state_layer_ids')}")

    tcfg = AutoConfig.from_pretrained(target)
    hidden, tvocab = tcfg.hidden_size, tcfg.vocab_size
    sys.path.insert(0, str(FILES))
    from specdec_pipeline import tracks, vocab  # noqa: PLC0415 - the package the role ships

    d2t_np, t2d_np = vocab.load(tracks.load(cfg_path))  # the vocab step's mapping, as training read it
    with safe_open(str(export / "model.safetensors"), framework="pt") as f:
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        shapes = {k: tuple(f.get_tensor(k).shape) for k in f.keys()}  # noqa: SIM118
    draft = conf["draft_vocab_size"]
    record("export: d2t/t2d inside the safetensors equal the vocab step's",
           torch.equal(d2t, d2t_np) and torch.equal(t2d, t2d_np) and d2t.dtype == torch.int64
           and t2d.dtype == torch.bool and tuple(d2t.shape) == (draft,) and tuple(t2d.shape) == (tvocab,)
           and int(t2d.sum()) == draft,
           f"d2t {tuple(d2t.shape)} {d2t.dtype}, t2d {tuple(t2d.shape)} {t2d.dtype}, {int(t2d.sum())} selected")
    expect = {"fc.weight": (hidden, 3 * hidden), "lm_head.weight": (draft, hidden), "norm.weight": (hidden,),
              "embed_tokens.weight": (tvocab, hidden)}
    wrong = {k: (shapes.get(k), v) for k, v in expect.items() if shapes.get(k) != v}
    record("export: tensor shapes", not wrong, f"{len(shapes)} tensors; " + (f"wrong {wrong}" if wrong else
           ", ".join(f"{k} {v}" for k, v in expect.items())))

    # The exported ids must select, in the target's own forward pass, the tensors the data was built from:
    # HF hidden_states[v] is the input of layer v, i.e. what vLLM captures for aux id v.
    sample = sorted((run_dir / "extract").glob("data_*.pt"))[0]
    data = torch.load(sample, map_location="cuda")
    model = AutoModelForCausalLM.from_pretrained(target, dtype="auto").to("cuda").eval()  # as the extractor loads it
    with torch.no_grad():
        out = model(data["input_ids"].unsqueeze(0).to("cuda"), output_hidden_states=True)

    def rel(a, b):
        a = a.to(b.dtype)
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))

    ids = conf["eagle_aux_hidden_state_layer_ids"]
    at_ids = [rel(out.hidden_states[v][0], data["hidden_states"][i]) for i, v in enumerate(ids)]
    at_ids_minus_one = [rel(out.hidden_states[v - 1][0], data["hidden_states"][i]) for i, v in enumerate(ids)]
    record("export ids select the training tensors in the target's forward (GPU)",
           max(at_ids) < 2e-2 and min(at_ids_minus_one) > 5e-2,
           f"max relative diff at exported ids {max(at_ids):.1e}; at ids-1 (off by one) {min(at_ids_minus_one):.1e}")


def figures(run_dir: Path) -> None:
    ext = manifest(run_dir, "extract")
    tokens, secs = ext["counts"]["tokens"], ext["seconds"]
    rows.append(("extraction (transformers, bf16, GPU)", "FIGURE",
                 f"{tokens} tokens in {secs:.2f} s = {tokens / secs:,.0f} tokens/s ({ext['counts']['samples']} samples)"))
    tr = manifest(run_dir, "train")
    steps, tsecs = tr["counts"]["steps"], tr["seconds"]
    rows.append(("training (speculators trainer, torchrun, bf16)", "FIGURE",
                 f"{steps} steps in {tsecs:.1f} s = {steps / tsecs:.2f} steps/s incl. start-up; "
                 f"{tr['counts']['epochs']} epochs, final loss {tr['counts']['final_loss']}"))
    metrics = [json.loads(x) for x in (run_dir / "train" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [m["time"] for m in metrics if "train" in m]
    if len(times) > 2:
        rows.append(("training steady state", "FIGURE",
                     f"{(len(times) - 1) / (times[-1] - times[0]):.2f} steps/s between the first and last logged step"))


def main() -> int:
    import torch  # noqa: PLC0415

    OUT.mkdir(parents=True, exist_ok=True)
    rows.append(("machine", "INFO", f"{torch.cuda.get_device_name(0)} cc {torch.cuda.get_device_capability(0)}, "
                                    f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"))
    gpu_check()
    cfg_path, _summary = run_pipeline()
    run_dir = Path(json.loads(cfg_path.read_text())["run_dir"])
    tr = manifest(run_dir, "train")
    record("train ran on the GPU with the real trainer", tr["counts"]["device"] == "cuda" and tr["counts"]["steps"] > 0,
           f"device {tr['counts']['device']}, {tr['counts']['steps']} steps, {tr['counts']['epochs']} epochs")
    check_export(cfg_path, run_dir, Path(json.loads(cfg_path.read_text())["target"]["path"]))
    figures(run_dir)
    return finish(0)


if __name__ == "__main__":
    sys.exit(main())
