"""The current track: vLLM (>= 0.25; the CPU build on CPU profiles) + speculators 0.9 + hs-connectors, no patches.

regenerate, prepare and vocab are the shared steps. This package's own:
- extract: a managed vLLM server with the `extract_hidden_states` method writes one safetensors file per sample
  (bf16, or FP8 with one scale per token), moved into extract/hidden_states/hs_<i>.safetensors beside the prepared
  samples as a datasets folder (extract/dataset) - the layout `speculators train` reads;
- train: `speculators train` (its own trainer, resume and checkpoints) on that data and the vocab step's mapping;
- export: the speculators-format checkpoint of the epoch with the best validation acceptance (train_figures; the
  last epoch where the log has no validation figures), checked and copied to export/.
train and export also run for each other draft algorithm of the run (algorithms.py: dflash, dspark) as
train-<algo> and export-<algo>, from the same extraction and vocab mapping, into their own directories.

Its declarations - settings, step keys, the capture-id rule (vLLM's ids: id num_hidden_layers is the final
layer's output), the disk estimate - are in rules.py (tracks.API).

Changed settings (both tracks' rule): every setting is checked before the run touches anything (each step's
check, run by cli.run first), and a changed extract or train is built in extract.new/ or train.new/ - resumed
there after a kill - while the finished output stays untouched until the new one is complete and swapped in (fsutil).
"""

from specdec_pipeline import steps
from specdec_pipeline.tracks.current.rules import (  # noqa: F401 - the track's API (tracks.API)
    DISK_FIX,
    DRAFT_STEP_KEYS,
    NAME,
    SETTINGS,
    STEP_KEYS,
    bytes_per_token,
    check_settings,
    default_layer_ids,
    extract_bytes_per_token,
    layer_ids,
    layer_ids_problem,
    storage_name,
)


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
