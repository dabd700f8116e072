"""A fresh FSDP start in speculators 0.3.0 leaves the draft's RMSNorm weights uninitialised; this gives them one.

speculators 0.3.0 (train/utils.py apply_fully_sharded, train/trainer.py Trainer.setup_model) moves every decoder
layer to the meta device, shards it, then calls ``to_empty`` and ``reset_parameters()`` on each sub-module that
has one. transformers' LlamaRMSNorm has no ``reset_parameters``: its weight keeps whatever the new allocation
held (NaN or ~1e18 on the CPU, whatever the allocator reuses on a GPU). A resumed run loads every weight from
the checkpoint and is not affected. Giving each such norm a ``reset_parameters`` that sets the weight to ones
(the value LlamaRMSNorm is built with, as in the single-process path) lets speculators' own reset loop
initialise it.
"""

import types

import torch


def _ones(module):
    with torch.no_grad():
        module.weight.fill_(1.0)


def make_norms_resettable(model):
    """Adds reset_parameters (weight = 1) to each 1-D-weight module of model.layers lacking one; returns the count."""
    count = 0
    for module in model.layers.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "reset_parameters") or not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
            continue
        module.reset_parameters = types.MethodType(_ones, module)
        count += 1
    return count
