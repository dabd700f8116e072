"""The per-epoch validation figures of a real `speculators train` 0.9.0 log: data/train-eagle3-h200.log is the train
log of the code LM's EAGLE-3 draft on one H200 (docs/gpu-proof.md run 6, 4 epochs, COLUMNS=2000 as the train step
sets it), cut to its head, every 150th step record and every epoch's and validation line (trailing spaces taken
off); docs/gpu-runs/2026-12-06-h200-ce1f06d/manifest-train.json is what the train step recorded from the whole log."""

import json
from pathlib import Path

import pytest

from specdec_pipeline import train_figures

ROOT = Path(__file__).resolve().parents[2]
LOG = Path(__file__).parent / "data" / "train-eagle3-h200.log"
RECORD = ROOT / "docs" / "gpu-runs" / "2026-12-06-h200-ce1f06d" / "manifest-train.json"


def test_the_real_log_gives_what_the_train_step_recorded_on_the_gpu():
    per_epoch, left_out = train_figures.read_log(LOG, "eagle3", "0bcb6a517619d6f4")
    assert left_out == {}
    val = json.loads(RECORD.read_text())["counts"]["validation"]
    assert {str(e): f for e, f in per_epoch.items()} == val["per_epoch"]
    assert per_epoch[3]["full_acc"] == [0.88, 0.783, 0.704] and per_epoch[3]["expected_al"] == pytest.approx(3.367)
    best, why = train_figures.choose(per_epoch, [0, 1, 2, 3], left_out, LOG.name)
    assert (best, why) == (val["best_epoch"], val["chosen_by"]) == (3, val["chosen_by"])
    # another build's records are not this one's
    assert train_figures.read_log(LOG, "eagle3", "another-build") == ({}, {})


def test_an_earlier_epoch_is_exported_when_it_validated_better():
    per_epoch = train_figures.read_log(LOG, "eagle3", "0bcb6a517619d6f4")[0]
    best, why = train_figures.choose(per_epoch, [0, 1, 2], {}, LOG.name)  # epoch 3's checkpoint gone
    assert best == 2 and "epoch 2, the last" in why
    per_epoch[3] = dict(per_epoch[3], expected_al=3.0)  # a last epoch that validated worse than epoch 2's 3.312
    best, why = train_figures.choose(per_epoch, [0, 1, 2, 3], {}, LOG.name)
    assert best == 2 and "(the last, 3: 3.000)" in why
