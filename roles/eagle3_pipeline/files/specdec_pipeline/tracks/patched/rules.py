"""The patched track's declarations (tracks.API), imported by its package and its step modules; nothing heavy.

Capture ids: entry j is the residual stream after decoder layer layer_ids[j] (its output, before the final norm);
the last entry is the target of training. The exported config names vLLM's ids (the input of layer k + 1).
"""

from specdec_pipeline.errors import PipelineError
from specdec_pipeline.target import text_config

NAME = "patched"
SETTINGS = {}  # the shared settings (config.DEFAULTS, vllm_server.SETTINGS) are all this track reads
STEP_KEYS = {}  # the step hashes are exactly the shared ones (config.STEP_KEYS)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # extract.dtype: bytes per stored value
DISK_FIX = ""  # the disk estimate's hint beyond the work directory (disk.fix): none


def check_settings(cfg, where):
    """This track's own settings, checked when the configuration is loaded: it has none; it trains EAGLE-3 only."""
    if cfg["track"] == NAME and cfg["drafts"] != ["eagle3"]:
        raise PipelineError(f"{where}: drafts {cfg['drafts']}: the patched track trains EAGLE-3 only (speculators "
                            "0.3.0 has no DFlash or DSpark); set specdec_track: current, or "
                            "eagle3_pipeline_draft_algorithms: [eagle3].")


def default_layer_ids(num_layers):
    """speculators 0.3.0's default capture layers: three auxiliary layers and the last layer."""
    return [2, num_layers // 2, num_layers - 3, num_layers - 1]


def layer_ids_problem(ids, num_layers, target="the target"):
    """'' when IDS are capture layers of a target with NUM_LAYERS decoder layers, else the one-line problem."""
    ids = [int(k) for k in ids]
    if len(ids) < 2 or any(not 0 <= k < num_layers for k in ids) or ids != sorted(set(ids)):
        return (f"extract.layer_ids {ids}: expected at least 2 layer indices in 0..{num_layers - 1}, increasing and "
                f"each once (the last is the training target), for {target} ({num_layers} layers); fix "
                "eagle3_pipeline_layer_ids.")
    return ""


def layer_ids(cfg):
    """The capture ids of CFG (the default for its target when unset), checked against the target's layers."""
    n = int(text_config(cfg).num_hidden_layers)
    ids = cfg["extract"]["layer_ids"] or default_layer_ids(n)
    problem = layer_ids_problem(ids, n, cfg["target"]["path"])
    if problem:
        raise PipelineError(problem)
    return [int(k) for k in ids]


def vllm_layer_ids(capture_ids):
    """Capture (output of layer k) -> vLLM's eagle_aux_hidden_state_layer_ids (input of layer k+1)."""
    return [int(k) + 1 for k in capture_ids]


def storage_name(cfg):
    """How the hidden states are stored: extract.dtype."""
    return cfg["extract"]["dtype"]


def extract_bytes_per_token(cfg, n_layers, hidden):
    """Disk bytes per token of one extracted sample: NUM_LAYERS x HIDDEN values of extract.dtype (the token ids
    and loss mask are small beside them)."""
    return n_layers * hidden * DTYPE_BYTES[cfg["extract"]["dtype"]]
