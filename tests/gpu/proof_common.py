"""What every phase of tests/gpu/current_proof.py shares: the settings read from the environment (see
current_proof.py's docstring), the one `state` the proof records into (current_proof.json), the recording helpers,
the pipeline and evaluate-stage commands and the checks and figures several phases take of a run.

Importing this module puts the role's files (specdec_pipeline) and the repository root (tests.support) on sys.path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
sys.path.insert(0, str(FILES))
sys.path.insert(1, str(ROOT))
sys.dont_write_bytecode = True

from tests.support import pipeline_cli  # noqa: E402 - the pipeline's command line, as every test runs it
from tests.support.layer_capture import capture_layers  # noqa: E402 - the transformers reference, one home

OUT = Path(os.environ.get("CURRENT_PROOF_OUT", "gpu-proof-current")).resolve()
DEVICE = os.environ.get("CURRENT_PROOF_DEVICE", "cuda")
CODE_LM = Path(os.environ.get("CODE_LM", ROOT.parent / "shared" / "models" / "code-lm-16m")).resolve()
SAMPLES = int(os.environ.get("CURRENT_PROOF_SAMPLES", "400"))
EPOCHS = int(os.environ.get("CURRENT_PROOF_EPOCHS", "3"))
N_PROMPTS = int(os.environ.get("CURRENT_PROOF_PROMPTS", "64"))
MAX_TOKENS = int(os.environ.get("CURRENT_PROOF_MAX_TOKENS", "128"))
CONCURRENCY = [int(c) for c in os.environ.get("CURRENT_PROOF_CONCURRENCY", "1,8,32").split(",")]
PHASES = os.environ.get("CURRENT_PROOF_PHASES",
                        "code-fp8,eval-stage,eval-shifted,eval-code,train-sweep,fused,tiny-bf16,code-bf16,kimi-fp8"
                        ).split(",")
KIMI_TARGET = Path(os.environ["KIMI_TARGET"]).resolve() if os.environ.get("KIMI_TARGET") else None
KIMI_IDS = [2, 4, 5, 8]  # capture ids of the mini-Kimi's 8 text layers (inventory/local-kimi's)
DEADLINE = float(os.environ.get("CURRENT_PROOF_DEADLINE_S", "0")) or None
# the phases the deadline may skip (default: every phase); e.g. "recipe" keeps eval-stage whatever the time
DEADLINE_PHASES = {p for p in os.environ.get("CURRENT_PROOF_DEADLINE_PHASES", "").split(",") if p} or None
SEQ = int(os.environ.get("CURRENT_PROOF_SEQ", "512"))
EAGER = os.environ.get("CURRENT_PROOF_EAGER", "1") == "1"
TRAIN_SWEEP = [tuple(int(x) for x in v.split(":")) for v in
               os.environ.get("CURRENT_PROOF_TRAIN_SWEEP", "2048:2,16384:2,16384:8,65536:8").split(",") if v]
DRAFTS = [a for a in os.environ.get("CURRENT_PROOF_DRAFTS", "eagle3").split(",") if a]
# "block_size:num_layers[:epochs]"; the DFlash draft's own epochs (0, the default: CURRENT_PROOF_EPOCHS)
DFLASH_BLOCK, DFLASH_LAYERS, DFLASH_EPOCHS = ([int(x) for x in os.environ.get("CURRENT_PROOF_DFLASH", "8:2").split(":")]
                                              + [0])[:3]
TOTAL_SEQ = int(os.environ.get("CURRENT_PROOF_TOTAL_SEQ", "0")) or 4 * SEQ
LR = float(os.environ.get("CURRENT_PROOF_LR", "5e-4"))
NGRAM = os.environ.get("CURRENT_PROOF_NGRAM", "1") == "1"
REGENERATE = int(os.environ.get("CURRENT_PROOF_REGENERATE", "0"))  # code-fp8's replies written by the target (max tokens)
ATTN = os.environ.get("CURRENT_PROOF_ATTN", "auto")  # the draft's attention in training (eagle3_pipeline_draft_attn_impl)
HELDOUT = int(os.environ.get("CURRENT_PROOF_HELDOUT", "0"))  # conversations prepare holds out (the `heldout` set)
PIPELINE_EAGER = os.environ.get("CURRENT_PROOF_PIPELINE_EAGER", "1" if EAGER else "0") == "1"
EVAL_SETS = [s for s in os.environ.get("CURRENT_PROOF_EVAL_SETS", "jsonl,humaneval,heldout").split(",") if s]
EVAL_CONTROL = os.environ.get("CURRENT_PROOF_EVAL_CONTROL", "0") == "1"
WORKERS = int(os.environ.get("CURRENT_PROOF_WORKERS", "2"))  # `speculators train`'s loader workers
# recipe variants: "name:dotted.key=json,..." separated by ";" (e.g. "vocab8192:vocab.draft_vocab_size=8192")
RECIPE = [v for v in os.environ.get("CURRENT_PROOF_RECIPE", "").split(";") if v.strip()]
CODE_IDS = [1, 3, 4, 6]  # vLLM capture ids of the 6-layer code LM (6 = the final layer's output)
T0 = time.monotonic()
state: dict = {"date": time.strftime("%Y-%m-%d"), "device": DEVICE, "rows": [], "figures": {}, "phases": {}}


# -- recording -----------------------------------------------------------------------------------------------
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
           "current": {"device": DEVICE, "hs_storage": storage, "concurrency": concurrency, "enforce_eager": PIPELINE_EAGER,
                       "num_workers": WORKERS, "ready_timeout_s": 900, "cpu_kvcache_gib": 2}}
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
    worst, worst_off, nonzero = 0.0, 1e9, True
    for path in files[:: max(1, len(files) // n_files)][:n_files]:
        data = load_hidden_states(path)
        hs = data["hidden_states"].float()  # [tokens, len(ids), hidden]
        nonzero &= bool(hs.abs().sum(dim=-1).min() > 0)
        cap = capture_layers(layers, lambda: model(data["token_ids"].unsqueeze(0).to(dev)))

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


# -- the evaluate stage and its servers ----------------------------------------------------------------------
def eval_server_args(max_len: int) -> list:
    args = ["--max-model-len", str(max_len), "--no-enable-prefix-caching", "--max-num-batched-tokens", "8192"]
    if EAGER:
        args.append("--enforce-eager")
    if DEVICE == "cuda":
        return args + ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"]
    return args + ["--dtype", "float32"]


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


def backend_lines(run: Path) -> dict:
    """{log name: the lines of the run's server logs that name the attention backend vLLM chose (MLA on Kimi)}."""
    out = {}
    for log in sorted((run / "logs").glob("*.log")):
        hits = [ln.strip()[-200:] for ln in log.read_text(errors="replace").splitlines()
                if re.search(r"MLA|[Aa]ttention backend|Using \w+ backend", ln)]
        if hits:
            out[log.name] = hits[:3]
    return out
