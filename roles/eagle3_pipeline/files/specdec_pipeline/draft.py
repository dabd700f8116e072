"""Size of the drafts' checkpoints (speculators' checkpointer writes every epoch's): the EAGLE-3 draft (both tracks)
and the DFlash family's (the current track's other algorithms)."""

from specdec_pipeline.target import text_config


def _shape(cfg):
    """(hidden, vocab, draft vocab, captured aux layers, parameters of one decoder layer) of CFG's target."""
    tc = text_config(cfg)
    h, v, i = int(tc.hidden_size), int(tc.vocab_size), int(tc.intermediate_size)
    heads = int(tc.num_attention_heads)
    kv = int(getattr(tc, "num_key_value_heads", None) or heads)
    hd = h // heads
    d = min(int(cfg["vocab"]["draft_vocab_size"]), v)
    n_aux = max(len(cfg["extract"]["layer_ids"] or [0, 0, 0, 0]) - 1, 1)
    layer = 2 * h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * i + 3 * h
    return h, v, d, n_aux, layer


def checkpoint_bytes(cfg, epochs=None):
    """About the bytes speculators' checkpointer writes, kept for every epoch: the draft's weights in bf16
    (the frozen embedding included) and Adam's two bf16 moments of every trained parameter; margin 1.2."""
    h, v, d, n_aux, layer = _shape(cfg)
    trained = d * h + n_aux * h * h + int(cfg["train"]["num_layers"]) * layer + h
    per_epoch = 2 * (v * h + trained) + 4 * trained + (64 << 10)
    epochs = int(cfg["train"]["epochs"]) if epochs is None else epochs
    return int(per_epoch * epochs * 1.2)


def block_checkpoint_bytes(cfg, num_layers, epochs=None):
    """The same for a DFlash-family draft of NUM_LAYERS layers: fc over the aux layers, the layers, the draft
    vocabulary's head and the norms; no embedding of its own (vLLM serves it with the target's)."""
    h, _v, d, n_aux, layer = _shape(cfg)
    trained = d * h + n_aux * h * h + int(num_layers) * layer + 2 * h
    per_epoch = 2 * trained + 4 * trained + (64 << 10)
    epochs = int(cfg["train"]["epochs"]) if epochs is None else epochs
    return int(per_epoch * epochs * 1.2)
