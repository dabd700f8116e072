"""The export's check of the vocabulary mapping (tracks/current/export.py check_export) on real safetensors files,
in the current track's venv (torch, safetensors): a draft over the target's whole vocabulary carries no d2t/t2d
(speculators 0.9 stores none, vLLM reads none), a pruned draft must carry the vocab step's own mapping."""

import json

import pytest
from test_current_track import pytestmark  # noqa: F401 pylint: disable=unused-import
from test_current_track import venv_python

CASE = """
import json, sys, tempfile
import torch
from safetensors.torch import save_file
from specdec_pipeline.tracks.current.export import check_export

draft_vocab, stored, shift = json.loads(sys.argv[1])
d2t = torch.zeros(draft_vocab, dtype=torch.long)  # offsets: draft id + d2t = target id
t2d = torch.zeros(16, dtype=torch.bool)  # a target vocabulary of 16
t2d[:draft_vocab] = True
tensors = {"fc.weight": torch.zeros(2, 2)}
if stored:
    kept = d2t.clone()
    kept[0] += shift
    tensors.update(d2t=kept, t2d=t2d)
with tempfile.TemporaryDirectory() as tmp:
    save_file(tensors, tmp + "/model.safetensors")
    try:
        check_export(tmp + "/model.safetensors", {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}, [1, 3, 4], d2t, t2d)
        print("accepted")
    except ValueError as exc:
        print("refused:", exc)
"""


def check(draft_vocab, stored, shift=0):
    """What check_export says of a draft of DRAFT_VOCAB tokens (of 16) whose weights hold a mapping (STORED), its
    first offset moved by SHIFT."""
    return venv_python(CASE.replace("sys.argv[1]", repr(json.dumps([draft_vocab, stored, shift])))).strip()


@pytest.mark.parametrize("stored", [False, True], ids=["no-mapping", "identity-kept"])
def test_a_draft_of_the_whole_vocabulary_needs_no_mapping(stored):
    assert check(16, stored) == "accepted"


def test_a_pruned_draft_without_its_mapping_is_refused():
    out = check(8, False)
    assert out.startswith("refused:") and "no d2t tensor" in out, out


def test_a_pruned_draft_with_another_mapping_is_refused():
    out = check(8, True, shift=3)
    assert out.startswith("refused:") and "differ from the vocab step's mapping" in out, out


def test_a_pruned_draft_with_its_own_mapping_is_accepted():
    assert check(8, True) == "accepted"
