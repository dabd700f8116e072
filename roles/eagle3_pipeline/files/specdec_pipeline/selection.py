"""Which conversations of the dataset prepare trains on and which it holds out - decided from the dataset settings
alone, so that regenerate (which answers exactly the training ones) and prepare agree without importing each other.
"""

import random

from specdec_pipeline.errors import PipelineError


def select(cfg, convs):
    """Which conversations prepare trains on and which it holds out, decided from the dataset settings alone
    (regenerate answers exactly these): {"order", "heldout", "contaminated"} as source indices."""
    rng = random.Random(cfg["dataset"]["seed"])
    order = list(range(len(convs)))
    rng.shuffle(order)
    heldout_n = int(cfg["dataset"].get("heldout") or 0)
    if heldout_n and heldout_n >= len(order):
        raise PipelineError(f"prepare: dataset.heldout is {heldout_n} but {cfg['dataset']['source']} has only "
                            f"{len(order)} conversations; hold out fewer so some remain for training.")
    heldout_idx, order = order[:heldout_n], order[heldout_n:]
    # Decontaminate: a training conversation that opens with a held-out prompt would leak it.
    held_prompts = {prompt_key(convs[i]) for i in heldout_idx}
    contaminated = [i for i in order if prompt_key(convs[i]) in held_prompts] if heldout_idx else []
    order = [i for i in order if i not in set(contaminated)]
    if cfg["dataset"]["max_samples"]:
        order = order[: int(cfg["dataset"]["max_samples"])]
    return {"order": order, "heldout": heldout_idx, "contaminated": contaminated}


def prompt_key(messages):
    """The user turns before the first assistant reply (system prompts ignored), for decontamination."""
    key = []
    for m in messages:
        if m["role"] == "assistant":
            break
        if m["role"] == "user":
            key.append(" ".join(m["content"].split()))
    return tuple(key)
