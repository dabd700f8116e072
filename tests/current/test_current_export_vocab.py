"""The export's check of the vocabulary mapping (tracks/current/export.py check_export) on real safetensors files:
a draft over the target's whole vocabulary carries no d2t/t2d (speculators 0.9 stores none, vLLM reads none), a
pruned draft must carry the vocab step's own mapping."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the current track's venv has torch (scripts/test-current-track)")
safetensors_torch = pytest.importorskip("safetensors.torch")

FILES = Path(__file__).resolve().parents[2] / "roles" / "eagle3_pipeline" / "files"
if str(FILES) not in sys.path:
    sys.path.insert(0, str(FILES))
from specdec_pipeline.tracks.current.export import check_export  # noqa: E402

CONF = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
TARGET_VOCAB = 16


def mapping(draft_vocab):
    d2t = torch.zeros(draft_vocab, dtype=torch.long)  # offsets: draft id + d2t = target id
    t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
    t2d[:draft_vocab] = True
    return d2t, t2d


def weights(tmp_path, **extra):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"fc.weight": torch.zeros(2, 2), **extra}, str(path))
    return path


def test_a_draft_of_the_whole_vocabulary_needs_no_mapping(tmp_path):
    d2t, t2d = mapping(TARGET_VOCAB)
    check_export(weights(tmp_path), CONF, [1, 3, 4], d2t, t2d)
    check_export(weights(tmp_path, d2t=d2t, t2d=t2d), CONF, [1, 3, 4], d2t, t2d)  # an identity mapping kept: equal


def test_a_pruned_draft_without_its_mapping_is_refused(tmp_path):
    d2t, t2d = mapping(8)
    with pytest.raises(ValueError, match="no d2t tensor"):
        check_export(weights(tmp_path), CONF, [1, 3, 4], d2t, t2d)


def test_a_pruned_draft_with_another_mapping_is_refused(tmp_path):
    d2t, t2d = mapping(8)
    other = d2t.clone()
    other[0] = 3
    with pytest.raises(ValueError, match="differ from the vocab step's mapping"):
        check_export(weights(tmp_path, d2t=other, t2d=t2d), CONF, [1, 3, 4], d2t, t2d)
