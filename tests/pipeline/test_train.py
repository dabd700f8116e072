"""Training on the CPU (dense-mask attention vs FlexAttention), the exported checkpoint, and vLLM's capture
convention read from the real vLLM 0.16.0 sources."""

import json
import re
import tarfile

import pytest
import torch
from conftest import ROOT

from specdec_pipeline.tracks.patched import cpu_attention


def _block_mask(lengths, total):
    from speculators.models.eagle3.attention import create_combined_mask_mod
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(create_combined_mask_mod(torch.tensor(lengths), total), B=None, H=None,
                             Q_LEN=total, KV_LEN=total, device="cpu")


@pytest.mark.parametrize("draft_steps", [0, 1, 2])
def test_dense_mask_attention_equals_flex_attention(draft_steps):
    """Same attention as speculators' FlexAttention forward, for the packed-document mask and the draft
    diagonals added by extend_mask_for_draft_tokens at each TTT step."""
    from speculators.models.eagle3.attention import extend_mask_for_draft_tokens, flex_attention_forward

    total = 256
    mask = _block_mask([100, 90, 40], total)
    for _unused in range(draft_steps):
        mask = extend_mask_for_draft_tokens(mask)
    kv = total * (draft_steps + 1)
    g = torch.Generator().manual_seed(draft_steps)
    q = torch.randn(1, 4, total, 16, generator=g)
    k = torch.randn(1, 2, kv, 16, generator=g)
    v = torch.randn(1, 2, kv, 16, generator=g)
    want, _unused = flex_attention_forward(None, q, k, v, mask, scaling=0.25)
    got, _unused = cpu_attention.dense_mask_attention(None, q, k, v, mask, scaling=0.25)
    assert torch.allclose(got, want, atol=1e-5)


def test_dense_mask_attention_has_a_cpu_backward():
    from speculators.models.eagle3.attention import flex_attention_forward

    mask = _block_mask([64, 64], 128)
    q = torch.randn(1, 2, 128, 8, requires_grad=True)
    k, v = torch.randn(1, 2, 128, 8), torch.randn(1, 2, 128, 8)
    with pytest.raises(Exception, match="(?i)backward"):
        flex_attention_forward(None, q, k, v, mask)[0].sum().backward()
    q.grad = None
    cpu_attention.dense_mask_attention(None, q, k, v, mask)[0].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_exported_checkpoint_is_speculators_format(full_run):
    from safetensors import safe_open

    exp = full_run["run_dir"] / "export"
    conf = json.loads((exp / "config.json").read_text())
    assert conf["speculators_model_type"] == "eagle3"
    assert conf["speculators_config"]["verifier"]["name_or_path"] == str(full_run["target"])
    assert conf["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    with safe_open(str(exp / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert {"d2t", "t2d", "fc.weight", "lm_head.weight", "norm.weight"} <= keys
        assert f.get_tensor("t2d").dtype == torch.bool and int(f.get_tensor("t2d").sum()) == 128
        assert tuple(f.get_tensor("fc.weight").shape) == (64, 192)
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    loaded = Eagle3SpeculatorConfig.from_pretrained(exp)
    assert loaded.eagle_aux_hidden_state_layer_ids == [3, 5, 6]


def test_vllm_0_16_captures_the_input_of_each_aux_layer():
    """The +1 of the export rests on vLLM's llama.py: aux states are appended BEFORE layer idx runs."""
    sdist = ROOT / ".cache" / "upstream" / "vllm-0.16.0.tar.gz"
    if not sdist.exists():
        pytest.skip("fetch it: python tests/support/upstream.py vllm==0.16.0:sdist")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("vllm/model_executor/models/llama.py"))
        src = tar.extractfile(member).read().decode()
    loop = src[src.index("for idx, layer in enumerate("):]
    loop = loop[: loop.index("if not get_pp_group().is_last_rank")]
    append = re.search(r"aux_hidden_states\.append\(hidden_states \+ residual\)", loop)
    call = re.search(r"hidden_states, residual = layer\(", loop)
    assert append and call and append.start() < call.start()


def test_training_progress_never_counts_past_its_total(tmp_path):
    """The batch sampler packs anew each epoch, so an epoch may run more batches than the loader's length: the
    progress total follows what ended epochs ran, done never exceeds it and no ETA is negative."""
    import logging

    from specdec_pipeline.tracks.patched.train_worker import MetricsFile

    handler = MetricsFile(tmp_path / "metrics.jsonl", tmp_path / "progress.json", total_epochs=2, steps_per_epoch=4)
    seen = []
    for epoch, batches in ((0, 5), (1, 5)):
        for _unused in range(batches):
            handler.emit(logging.makeLogRecord({"msg": {"train": {"loss": 0.5}, "epoch": epoch}}))
            p = json.loads((tmp_path / "progress.json").read_text())
            seen.append((p["epoch"], p["done"], p["total"], p["eta_s"]))
    assert all(done <= total for _e, done, total, _eta in seen), seen
    assert all(eta is None or eta >= 0 for *_x, eta in seen), seen
    # Epoch 0: the loader's estimate (8), then the batches done once they pass it; from epoch 1: 5 per epoch.
    assert [total for _e, _d, total, _eta in seen] == [8, 8, 8, 8, 8, 10, 10, 10, 10, 10], seen
    assert seen[-1][1:3] == (10, 10)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 10
