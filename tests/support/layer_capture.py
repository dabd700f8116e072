"""The reference captured hidden states are compared against: one transformers forward with a hook on every decoder
layer.  Id k < N is the input of decoder layer k, id N the output of the last layer before the final norm (vLLM's
convention for the capture ids).  It imports torch only, so it also runs in another venv's interpreter (tests/kimi
puts this folder on that interpreter's path); tests/gpu's proof runs it on CUDA."""

import torch


def capture_layers(layers, forward):
    """Call forward() with hooks on layers (the decoder's ModuleList); return {k: tensor} for k in 0..len(layers)."""
    n = len(layers)
    cap = {}

    def before(k):
        def hook(_module, args, kwargs):
            cap[k] = (args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    def after(_module, _args, out):
        cap[n] = (out[0] if isinstance(out, tuple) else out).detach()

    handles = [layers[k].register_forward_pre_hook(before(k), with_kwargs=True) for k in range(n)]
    handles.append(layers[n - 1].register_forward_hook(after))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return cap
