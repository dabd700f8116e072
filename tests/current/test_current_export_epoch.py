"""The epoch the current track exports, in the finished inventory/local-current run: its train manifests record every
epoch's validation figures and the epoch with the best acceptance, and export took that epoch's checkpoint.

tests/pipeline/test_train_figures.py reads real train logs; this checks what the steps recorded from them.
SPECDEC_CURRENT_WORK overrides where the run is (as in test_current_track.py).
"""

import json
import os
from pathlib import Path

import pytest

PREFIX = Path.home() / ".local" / "share" / "specdec-eagle3"
WORK = Path(os.environ.get("SPECDEC_CURRENT_WORK", PREFIX / "work-current"))
RUN = WORK / "runs" / "tiny-current"


def manifest(step):
    path = RUN / "manifests" / f"{step}.json"
    if not path.exists():
        pytest.skip(f"run `ansible-playbook -i inventory/local-current site.yml` first ({path})")
    return json.loads(path.read_text())


@pytest.mark.parametrize("algo", ["eagle3", "dflash"])  # inventory/local-current drafts both
def test_export_took_the_epoch_with_the_best_validation_acceptance(algo):
    train, export = ("train", "export") if algo == "eagle3" else (f"train-{algo}", f"export-{algo}")
    tr, ex = manifest(train), manifest(export)
    val = tr["counts"].get("validation")
    if val is None:
        pytest.skip(f"{RUN} was trained before the train step recorded validation (SPECDEC_CURRENT_FRESH_RUN=1 "
                    "trains it again)")
    per_epoch = {int(e): fig for e, fig in val["per_epoch"].items()}
    assert sorted(per_epoch) == list(range(tr["counts"]["epochs"]))  # 2 samples held out: every epoch validated
    for fig in per_epoch.values():
        acc = fig["full_acc"] if algo == "eagle3" else fig["position_acc"]
        assert acc and all(0 <= a <= 1 for a in acc) and fig["expected_al"] >= 1
        if algo == "eagle3":
            assert fig["expected_al"] == pytest.approx(1 + sum(acc))
    best = max(per_epoch, key=lambda e: (per_epoch[e]["expected_al"], e))
    assert val["best_epoch"] == best and f"epoch {best}" in val["chosen_by"]
    assert (ex["counts"]["epoch"], ex["counts"]["chosen_by"]) == (best, val["chosen_by"])
    assert ex["counts"]["validation"] == per_epoch[best]
    copied = tr["outputs"][f"{train}/checkpoints/{best}/model.safetensors"]["sha256"]
    assert ex["outputs"][f"{export}/model.safetensors"]["sha256"] == copied
