"""The current track: vLLM (>= 0.25; the CPU build on CPU profiles) + speculators 0.9 + hs-connectors, no patches.

prepare and vocab are the shared steps. This package's own:
- extract: a managed vLLM server with the `extract_hidden_states` method writes one safetensors file per sample
  (bf16, or FP8 with one scale per token), moved into extract/hidden_states/hs_<i>.safetensors beside the prepared
  samples as a datasets folder (extract/dataset) - the layout `speculators train` reads;
- train: `speculators train` (its own trainer, resume and checkpoints) on that data and the vocab step's mapping;
- export: the last epoch's speculators-format checkpoint, checked and copied to export/.

Capture ids follow vLLM's convention here: id k is the input of decoder layer k, id = num_hidden_layers is the
final layer's output (vLLM >= 0.25 for Kimi/DeepSeek). The last id is the training target; the others are what
the draft reads (eagle_aux_hidden_state_layer_ids of the exported config).

Changed settings (both tracks' rule): every setting is checked before the run touches anything (each step's
check, run by cli.run first), and a changed extract or train is built in extract.new/ or train.new/ - resumed
there after a kill - while the finished output stays untouched until the new one is complete and swapped in (fsutil).
"""

from specdec_pipeline import steps
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.target import text_config

NAME = "current"
STEP_KEYS = {"extract": ["track", "current.hs_storage", "current.language_model_only"],
             "train": ["track", "current.draft_attn_impl", "current.loss_implementation", "current.train_data_ratio"],
             "export": ["track"]}
TOKEN_ID_BYTES = 8           # int64 token id per token
FP8_SCALE_BYTES = 4          # float32 scale per token (hs-connectors' FP8 layout)


def _extract():
    from specdec_pipeline.tracks.current import extract  # noqa: PLC0415 - only when this track runs

    return extract


def _train():
    from specdec_pipeline.tracks.current import train  # noqa: PLC0415

    return train


def _export():
    from specdec_pipeline.tracks.current import export  # noqa: PLC0415

    return export


STEPS = {"regenerate": steps.regenerate, "prepare": steps.prepare, "extract": _extract, "vocab": steps.vocab, "train": _train, "export": _export}


def default_layer_ids(num_layers):
    """speculators 0.9's default: [2, n//2, n-3] plus the final layer (id n)."""
    return [2, num_layers // 2, num_layers - 3, num_layers]


def layer_ids_problem(ids, num_layers, target="the target"):
    """'' when IDS are vLLM capture ids of a target with NUM_LAYERS decoder layers, else the one-line problem."""
    ids = [int(k) for k in ids]
    n = num_layers
    if len(ids) < 2 or any(not 0 <= k <= n for k in ids) or ids[-1] != n or len(set(ids)) != len(ids):
        return (f"extract.layer_ids {ids}: on the current track expected distinct vLLM capture ids in 0..{n} ending "
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


def bytes_per_token(n_layers, hidden, storage):
    """Disk bytes per token of one hidden-states file: bf16 values, or fp8 values plus a float32 scale."""
    if storage == "fp8":
        return n_layers * hidden + FP8_SCALE_BYTES + TOKEN_ID_BYTES
    return n_layers * hidden * 2 + TOKEN_ID_BYTES


def extract_bytes_per_token(cfg, n_layers, hidden):
    return bytes_per_token(n_layers, hidden, cfg["current"]["hs_storage"])
