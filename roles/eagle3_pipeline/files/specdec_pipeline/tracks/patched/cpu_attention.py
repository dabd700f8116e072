"""A dense attention implementation for the EAGLE-3 draft on the CPU.

speculators' draft attends through FlexAttention ("simple_flex_attention"); torch 2.13 has no FlexAttention
backward on the CPU. This implementation evaluates the same BlockMask's mask_mod densely (for the actual
query/key lengths, including the draft-token diagonals) and runs torch's scaled_dot_product_attention, whose
backward exists on the CPU. The attention computed is the same; tests/pipeline compare it with FlexAttention's
forward.
"""

import torch
from transformers.modeling_utils import AttentionInterface

NAME = "specdec_dense_mask_sdpa"


def dense_mask(block_mask, q_len, kv_len, device):
    q_idx = torch.arange(q_len, device=device).view(q_len, 1)
    kv_idx = torch.arange(kv_len, device=device).view(1, kv_len)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    return block_mask.mask_mod(zero, zero, q_idx, kv_idx).expand(q_len, kv_len)


def dense_mask_attention(module, query, key, value, attention_mask, scaling=None, **_kwargs):  # noqa: ARG001
    mask = dense_mask(attention_mask, query.shape[2], key.shape[2], query.device)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register():
    AttentionInterface.register(NAME, dense_mask_attention)
    return NAME
