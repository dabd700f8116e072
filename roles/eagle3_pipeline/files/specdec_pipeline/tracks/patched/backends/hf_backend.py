"""transformers backend for extract: for small targets and machines without vLLM.

Forward hooks on the decoder layers record each captured layer's output, i.e. the residual stream after
layer k before the final norm - the same tensors speculators' vLLM worker stores.
"""

import torch

from specdec_pipeline.errors import PipelineError


def decoder_layers(model):
    for path in ("model.layers", "model.language_model.layers", "language_model.model.layers"):
        node = model
        try:
            for part in path.split("."):
                node = getattr(node, part)
        except AttributeError:
            continue
        return node
    raise PipelineError(f"{type(model).__name__}: no decoder layers found (model.layers); "
                        "use the vllm backend for this target.")


class HfBackend:
    def __init__(self, cfg, layer_ids, dtype):
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        self.layer_ids = layer_ids
        self.model = AutoModelForCausalLM.from_pretrained(
            cfg["target"]["path"], trust_remote_code=cfg["target"]["trust_remote_code"], dtype="auto")
        # On a GPU host the forward runs there; captured states are copied back to the CPU for saving.
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(self.device).eval()
        self.captured = {}
        layers = decoder_layers(self.model)
        for k in layer_ids:
            layers[k].register_forward_hook(self._hook(k))

    def _hook(self, k):
        def hook(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.captured[k] = out[0].detach().to("cpu", copy=True)
        return hook

    def batches(self, samples):
        for s in samples:
            yield [s]

    @torch.no_grad()
    def run(self, batch):
        results = []
        for s in batch:
            self.captured = {}
            self.model(torch.tensor([s["input_ids"]], dtype=torch.long, device=self.device), use_cache=False)
            results.append([self.captured[k] for k in self.layer_ids])
        return results
