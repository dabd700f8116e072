"""Run configuration: the shared settings - their defaults, checks and the keys each step's hash covers - and the
helpers every step uses (run_path, step_config, max_model_len, extract_dtype).

The loader of a run configuration is tracks.load (the seam): it merges these defaults with the managed server's
(vllm_server.SETTINGS) and every track's own (tracks/<track>/rules.py SETTINGS), checks the track's name and runs
each part's check. This module imports nothing of the tracks (no import circle: the step modules import it).

Which keys feed which step's config hash is data (STEP_KEYS, plus the running track's): changing one of them
re-runs that step and, through the manifests' input digests, every step after it.
"""

import copy
import json
from pathlib import Path

from specdec_pipeline import algorithms
from specdec_pipeline.errors import PipelineError

DEFAULTS = {
    "run_dir": None,                 # required: everything of this run lives below it
    "track": None,                   # a name of tracks.TRACKS (None: tracks.DEFAULT): which implementation runs the steps
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
        "disk_margin": 1.1,          # disk.py: the free space a check demands, x the hidden states' size (0: no check)
    },
    "vocab": {"draft_vocab_size": 32000},
    "train": {
        "epochs": 20, "lr": 1e-4, "total_seq_len": 8192, "num_layers": 1, "ttt_steps": 3,
        "ttt_step_loss_decay": 1.0, "nproc": 1, "device": "auto", "attention": "auto", "seed": 0,
        "cpu_training": True,
    },
    "export": {"speculative_tokens": 3},
    # The draft algorithms trained from the one extraction (algorithms.py): EAGLE-3 in train/ and export/, each
    # other in train-<algo>/ and export-<algo>/.
    "drafts": ["eagle3"],
    # The managed vLLM server's settings (vllm_server.SETTINGS) and each track's own section (tracks/<track>/rules.py
    # SETTINGS) are added by tracks.load.
}

# Config keys (dotted) each step's hash covers.
STEP_KEYS = {
    "regenerate": ["target", "dataset", "seq_length", "chat_mode", "regenerate.enabled", "regenerate.temperature",
                   "regenerate.top_p", "regenerate.max_tokens", "regenerate.seed",
                   "current.max_model_len"],  # the managed server's context (vllm_server.SETTINGS)
    "prepare": ["target", "dataset", "seq_length", "min_mask_share", "chat_mode", "regenerate.keep_truncated"],
    "extract": ["target", "extract.backend", "extract.layer_ids", "extract.dtype"],
    "vocab": ["target", "vocab"],
    "train": ["target", "train.epochs", "train.lr", "train.total_seq_len", "train.num_layers", "train.ttt_steps",
              "train.ttt_step_loss_decay", "train.seed"],
    "export": ["target", "export", "extract.layer_ids"],
}
# Each track adds its own keys (its package's STEP_KEYS; the patched track's hashes are exactly these).
# The steps of an algorithm other than EAGLE-3 (train-<algo>, export-<algo>; algorithms.py): the shared keys their
# hashes cover, beside the track's own (its package's DRAFT_STEP_KEYS). Not "drafts": adding an algorithm re-runs
# nothing that was built for another.
DRAFT_STEP_KEYS = {"train": ["target", "train.epochs", "train.lr", "train.total_seq_len", "train.seed"],
                   "export": ["target", "extract.layer_ids"]}
EXTRACT_DTYPES = ("bfloat16", "float16", "float32")  # extract.dtype: what the hidden states are stored as


def combine(base, extra, where="defaults"):
    """BASE with the declared defaults EXTRA added, section by section; a key declared twice is a programming error."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = combine(out[key], value, f"{where}.{key}")
        elif key in out:
            raise ValueError(f"{where}.{key} is declared twice")
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge(base, over, where):
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if key not in base:
            raise PipelineError(f"{where}: unknown key {key!r}; expected one of {sorted(base)}. "
                                "Remove or rename it.")
        if isinstance(base[key], dict) and base[key] and isinstance(value, dict):
            out[key] = merge(base[key], value, f"{where}.{key}")
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


MISSING = "config file not found; render it with the eagle3_pipeline role or write one (see docs/pipeline.md)."


def check(cfg, where):
    """The shared settings of CFG (read from WHERE), checked: one PipelineError naming the first problem."""
    for key in ("run_dir",):
        if not cfg[key]:
            raise PipelineError(f"{where}: {key} is required (an absolute directory).")
    if not cfg["target"]["path"]:
        raise PipelineError(f"{where}: target.path is required (a local model directory).")
    if not cfg["dataset"]["source"]:
        raise PipelineError(f"{where}: dataset.source is required (sharegpt, ultrachat, a hub id, "
                            "or a local .json/.jsonl of conversations).")
    if cfg["extract"]["backend"] not in ("transformers", "vllm"):
        raise PipelineError(f"{where}: extract.backend is {cfg['extract']['backend']!r}; "
                            "expected 'transformers' or 'vllm'.")
    if not isinstance(cfg["dataset"]["heldout"], int) or cfg["dataset"]["heldout"] < 0:
        raise PipelineError(f"{where}: dataset.heldout is {cfg['dataset']['heldout']!r}; expected a whole number "
                            ">= 0 (conversations held out of training for evaluation).")
    if not 0 <= float(cfg["min_mask_share"]) <= 1:
        raise PipelineError(f"{where}: min_mask_share must be between 0 and 1.")
    algorithms.check(cfg, where)


def pick(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def step_keys(track_keys, algos=(), track_draft_keys=None):
    """{step: the config keys its hash covers}: STEP_KEYS plus TRACK_KEYS, a track's own STEP_KEYS (tracks.load
    stores the running track's in the configuration as "_step_keys"); for each of ALGOS (the drafted algorithms
    besides EAGLE-3) its train-<algo> and export-<algo> steps: DRAFT_STEP_KEYS plus TRACK_DRAFT_KEYS."""
    out = {step: keys + list(track_keys.get(step, [])) for step, keys in STEP_KEYS.items()}
    for algo in algos:
        for base, keys in DRAFT_STEP_KEYS.items():
            out[algorithms.step_name(base, algo)] = keys + list((track_draft_keys or {}).get(base, []))
    return out


def step_config(cfg, step):
    """{key: value} of the keys STEP's hash covers on CFG's track (CFG as tracks.load returns it)."""
    return {k: pick(cfg, k) for k in cfg["_step_keys"][step]}


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
