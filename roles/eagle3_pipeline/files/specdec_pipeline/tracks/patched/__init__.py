"""The patched track: speculators 0.3.x patched at source level, vLLM 0.16-era, in-process extraction.

regenerate, prepare and vocab are the shared steps; extract (the transformers or the patched vLLM backend,
backends/), train (train_worker under torchrun or a plain process) and export are this package's. Its
declarations - settings, step keys, the capture-id rule, the disk estimate - are in rules.py (tracks.API).
"""

from specdec_pipeline import steps
from specdec_pipeline.tracks.patched.rules import (  # noqa: F401 - the track's API (tracks.API)
    DISK_FIX,
    NAME,
    SETTINGS,
    STEP_KEYS,
    check_settings,
    default_layer_ids,
    extract_bytes_per_token,
    layer_ids,
    layer_ids_problem,
    storage_name,
    vllm_layer_ids,
)


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
