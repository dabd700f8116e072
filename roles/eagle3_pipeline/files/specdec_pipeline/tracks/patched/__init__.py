"""The patched track: speculators 0.3.x patched at source level, vLLM 0.16-era, in-process extraction.

prepare and vocab are the shared steps; extract (the transformers or the patched vLLM backend, backends/), train
(train_worker under torchrun or a plain process) and export are this package's.

Capture ids: entry j is the residual stream after decoder layer layer_ids[j] (its output, before the final norm);
the last entry is the target of training. The exported config names vLLM's ids (the input of layer k + 1).
"""

from specdec_pipeline import steps
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.target import text_config

NAME = "patched"
STEP_KEYS = {}  # the step hashes are exactly the shared ones (config.STEP_KEYS)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # extract.dtype: bytes per stored value


def _extract():
    from specdec_pipeline.tracks.patched import extract  # noqa: PLC0415 - only when this track runs

    return extract


def _train():
    from specdec_pipeline.tracks.patched import train  # noqa: PLC0415

    return train


def _export():
    from specdec_pipeline.tracks.patched import export  # noqa: PLC0415

    return export


STEPS = {"regenerate": steps.regenerate, "prepare": steps.prepare, "extract": _extract, "vocab": steps.vocab, "train": _train, "export": _export}


def default_layer_ids(num_layers):
    """speculators 0.3.0's default capture layers: three auxiliary layers and the last layer."""
    return [2, num_layers // 2, num_layers - 3, num_layers - 1]


def layer_ids_problem(ids, num_layers, target="the target"):
    """'' when IDS are capture layers of a target with NUM_LAYERS decoder layers, else the one-line problem."""
    if len(ids) < 2 or any(not 0 <= int(k) < num_layers for k in ids):
        return (f"extract.layer_ids {list(ids)}: expected at least 2 layer indices in 0..{num_layers - 1} "
                f"for {target} ({num_layers} layers); fix the profile.")
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


def extract_bytes_per_token(cfg, n_layers, hidden):
    """Disk bytes per token of one extracted sample: NUM_LAYERS x HIDDEN values of extract.dtype (the token ids
    and loss mask are small beside them)."""
    return n_layers * hidden * DTYPE_BYTES[cfg["extract"]["dtype"]]
