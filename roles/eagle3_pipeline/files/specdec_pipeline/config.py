"""Run configuration: a JSON file (rendered by the role) validated into a dict with defaults.

Which keys feed which step's config hash is data (STEP_KEYS): changing one of them re-runs that step
and, through the manifests' input digests, every step after it.
"""

import copy
import json
from pathlib import Path

from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import owned_arg
from specdec_pipeline.tracks import DEFAULT as DEFAULT_TRACK
from specdec_pipeline.tracks import TRACKS

DEFAULTS = {
    "run_dir": None,                 # required: everything of this run lives below it
    "track": DEFAULT_TRACK,          # a name of tracks.TRACKS: which implementation runs the steps (tracks/)
    # trust_remote_code: run the target's own *.py code (auto_map); off unless asked for (remote_code.py).
    "target": {"path": None, "trust_remote_code": False, "use_fast": True},
    "dataset": {"source": None, "split": "train", "max_samples": None, "seed": 0,
                "heldout": 0},               # conversations kept out of training for the evaluate stage
    "seq_length": 2048,
    "chat_mode": "instant",          # thinking | instant: how regenerate, prepare and held-out prompts render
    # regenerate (regenerate.py): the target answers the training prompts itself; the server is the extraction's.
    "regenerate": {"enabled": False, "temperature": 0.0, "top_p": 1.0, "max_tokens": 1024, "seed": 0,
                   "concurrency": 8,
                   "keep_truncated": False},  # prepare trains on a reply cut off at max_tokens, up to the cut
    "min_mask_share": 0.9,           # fail prepare when fewer samples have a non-empty loss mask
    "extract": {
        "backend": "transformers",   # transformers | vllm
        "layer_ids": None,           # None: [2, L//2, L-3, L-1] (speculators' default)
        "dtype": "bfloat16",
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.8,
        "max_num_batched_tokens": 8192,
        "batch_size": 8,
        "disk_margin": 1.1,
    },
    "vocab": {"draft_vocab_size": 32000},
    "train": {
        "epochs": 20, "lr": 1e-4, "total_seq_len": 8192, "num_layers": 1, "ttt_steps": 3,
        "ttt_step_loss_decay": 1.0, "nproc": 1, "device": "auto", "attention": "auto", "seed": 0,
        "cpu_training": True,
    },
    "export": {"speculative_tokens": 3},
    # The current track only (tracks/current/): server-side extraction and `speculators train`.
    "current": {
        "device": "cuda",            # cuda | cpu (the CPU profile: CPU connector, accelerator calls redirected)
        "hs_storage": "bf16",        # bf16 | fp8 (hs-connectors' FP8 backend: about half the disk)
        "port": 0,                   # 0: a free port is picked at start
        "ready_timeout_s": 1800,
        "request_timeout_s": 900,
        "concurrency": 8,
        "max_model_len": None,       # None: seq_length + 1
        "language_model_only": False,
        "enforce_eager": False,
        "cpu_kvcache_gib": 2,
        "server_args": [],           # extra `vllm serve` arguments
        "draft_attn_impl": "auto",   # auto: sdpa on the CPU or when head_dim > 128, else simple_flex_attention
        "loss_implementation": "auto",  # auto: what a GPU run proved on the installed stack (tracks/current/train.py), else eager
        "train_data_ratio": 0.9,
        "num_workers": 2,
    },
}

# Config keys (dotted) each step's hash covers.
STEP_KEYS = {
    "regenerate": ["target", "dataset", "seq_length", "chat_mode", "regenerate.enabled", "regenerate.temperature",
                   "regenerate.top_p", "regenerate.max_tokens", "regenerate.seed", "current.max_model_len"],
    "prepare": ["target", "dataset", "seq_length", "min_mask_share", "chat_mode", "regenerate.keep_truncated"],
    "extract": ["target", "extract.backend", "extract.layer_ids", "extract.dtype"],
    "vocab": ["target", "vocab"],
    "train": ["target", "train.epochs", "train.lr", "train.total_seq_len", "train.num_layers", "train.ttt_steps",
              "train.ttt_step_loss_decay", "train.seed"],
    "export": ["target", "export", "extract.layer_ids"],
}
# Each track adds its own keys (its package's STEP_KEYS; the patched track's hashes are exactly these).
HS_STORAGE = ("bf16", "fp8")
EXTRACT_DTYPES = ("bfloat16", "float16", "float32")  # extract.dtype: what the hidden states are stored as


def _merge(base, over, where):
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if key not in base:
            raise PipelineError(f"{where}: unknown key {key!r}; expected one of {sorted(base)}. "
                                "Remove or rename it.")
        if isinstance(base[key], dict) and base[key] and isinstance(value, dict):
            out[key] = _merge(base[key], value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def read_config_file(path, missing):
    """The JSON object in PATH (a run or an evaluation configuration); one PipelineError naming the file when it
    is absent (MISSING says what to do), not JSON or not an object."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: {missing}") from None
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}: not valid JSON ({exc}); fix the file.") from None
    if not isinstance(raw, dict):
        raise PipelineError(f"{path}: expected a JSON object of settings, found {type(raw).__name__}; fix the file.")
    return raw


def load(path):
    path = Path(path)
    raw = read_config_file(path, "config file not found; render it with the eagle3_pipeline role or write one "
                                 "(see docs/pipeline.md).")
    cfg = _merge(DEFAULTS, raw, str(path))
    for key in ("run_dir",):
        if not cfg[key]:
            raise PipelineError(f"{path}: {key} is required (an absolute directory).")
    if not cfg["target"]["path"]:
        raise PipelineError(f"{path}: target.path is required (a local model directory).")
    if not cfg["dataset"]["source"]:
        raise PipelineError(f"{path}: dataset.source is required (sharegpt, ultrachat, a hub id, "
                            "or a local .json/.jsonl of conversations).")
    if cfg["extract"]["backend"] not in ("transformers", "vllm"):
        raise PipelineError(f"{path}: extract.backend is {cfg['extract']['backend']!r}; "
                            "expected 'transformers' or 'vllm'.")
    if not isinstance(cfg["dataset"]["heldout"], int) or cfg["dataset"]["heldout"] < 0:
        raise PipelineError(f"{path}: dataset.heldout is {cfg['dataset']['heldout']!r}; expected a whole number "
                            ">= 0 (conversations held out of training for evaluation).")
    if cfg["track"] not in TRACKS:
        raise PipelineError(f"{path}: track is {cfg['track']!r}; expected one of {sorted(TRACKS)} "
                            "(specdec_track in the inventory).")
    if cfg["current"]["hs_storage"] not in HS_STORAGE:
        raise PipelineError(f"{path}: current.hs_storage is {cfg['current']['hs_storage']!r}; expected one of "
                            f"{list(HS_STORAGE)} (eagle3_pipeline_hs_storage).")
    if cfg["current"]["device"] not in ("cuda", "cpu"):
        raise PipelineError(f"{path}: current.device is {cfg['current']['device']!r}; expected 'cuda' or 'cpu'.")
    if cfg["current"]["loss_implementation"] not in ("auto", "fused", "eager"):
        raise PipelineError(f"{path}: current.loss_implementation is {cfg['current']['loss_implementation']!r}; "
                            "expected 'auto', 'fused' or 'eager' (eagle3_pipeline_loss_implementation).")
    if not isinstance(cfg["current"]["server_args"], list):
        raise PipelineError(f"{path}: current.server_args is {cfg['current']['server_args']!r}; expected a list of "
                            "strings (eagle3_pipeline_server_args).")
    owned = owned_arg(cfg["current"]["server_args"])
    if owned:
        raise PipelineError(f"{path}: current.server_args (eagle3_pipeline_server_args) contains {owned!r}; the "
                            "pipeline sets the extraction server's host (127.0.0.1), port and API key itself - remove "
                            "it (current.port chooses a fixed port; 0 picks a free one).")
    if not 0 <= float(cfg["min_mask_share"]) <= 1:
        raise PipelineError(f"{path}: min_mask_share must be between 0 and 1.")
    cfg["_path"] = str(path)
    return cfg


def pick(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def step_config(cfg, step):
    keys = STEP_KEYS[step] + TRACKS[cfg.get("track", DEFAULT_TRACK)].STEP_KEYS.get(step, [])
    return {k: pick(cfg, k) for k in keys}


def max_model_len(cfg, override=None):
    """The context vLLM is started with for extraction: OVERRIDE when set, else seq_length + 1 (a sample of
    exactly seq_length tokens stays whole; the one generated token fits beside it)."""
    return int(override or int(cfg["seq_length"]) + 1)


def extract_dtype(cfg):
    """extract.dtype, checked: one of EXTRACT_DTYPES (the name the backends and the server take)."""
    if cfg["extract"]["dtype"] not in EXTRACT_DTYPES:
        raise PipelineError(f"extract.dtype {cfg['extract']['dtype']!r}: expected one of {sorted(EXTRACT_DTYPES)}; "
                            "fix eagle3_pipeline_extract_dtype.")
    return cfg["extract"]["dtype"]


def run_path(cfg, *parts):
    return Path(cfg["run_dir"]).joinpath(*parts)
