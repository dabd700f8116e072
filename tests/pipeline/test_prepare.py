"""Loss masks built without offset mappings: the slow SentencePiece tokenizer of the tiny target."""

import pytest
from conftest import DATASET
from transformers import AutoTokenizer

from specdec_pipeline.datasets_io import load_local
from specdec_pipeline.prepare import tokenize_conversation


@pytest.fixture(scope="module")
def tokenizers(tiny_target):
    return (AutoTokenizer.from_pretrained(tiny_target, use_fast=False),
            AutoTokenizer.from_pretrained(tiny_target, use_fast=True))


def test_slow_tokenizer_has_no_offset_mapping(tokenizers):
    slow, _fast = tokenizers
    assert not slow.is_fast
    with pytest.raises(NotImplementedError):
        slow("hello there", return_offsets_mapping=True)


def test_masks_cover_exactly_the_assistant_replies(tokenizers):
    slow, fast = tokenizers
    convs = load_local(DATASET)
    for conv in convs:
        for tok in (slow, fast):
            ids, mask = tokenize_conversation(tok, conv, 4096)
            masked_text = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
            expected = "".join(m["content"] + "<|end|>\n" for m in conv if m["role"] == "assistant")
            assert masked_text.replace(" ", "") == expected.replace(" ", "")
            unmasked = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
            assert "<|assistant|>" in unmasked and "<|user|>" in unmasked
            assert ids == tok.encode(tok.apply_chat_template(conv, tokenize=False), add_special_tokens=False)


def test_truncation_to_seq_length(tokenizers):
    slow, _unused = tokenizers
    conv = load_local(DATASET)[0]
    ids, mask = tokenize_conversation(slow, conv, 16)
    assert len(ids) == len(mask) == 16
