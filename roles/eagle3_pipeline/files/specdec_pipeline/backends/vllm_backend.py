"""vLLM backend for extract: speculators' VllmHiddenStatesGenerator (patched by the patch stage).

speculators 0.3.0 mis-slices hidden states when one batch exceeds the scheduler's token budget (its issue
#279), so the batch size is chosen so that batch x seq_length <= max_num_batched_tokens, else 1.
"""

import os

from specdec_pipeline.errors import PipelineError


def safe_batch_size(requested, seq_length, max_num_batched_tokens):
    fits = int(max_num_batched_tokens) // int(seq_length)
    return max(1, min(int(requested), fits))


class VllmBackend:
    def __init__(self, cfg, layer_ids, dtype):
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        try:
            from speculators.data_generation.vllm_hidden_states_generator import (  # noqa: PLC0415
                VllmHiddenStatesGenerator,
            )
        except ImportError as exc:
            raise PipelineError(f"extract backend vllm: cannot import speculators' generator ({exc}); install vLLM "
                                "in the ML venv (stack stage) or use extract.backend=transformers.") from None
        ex = cfg["extract"]
        self.batch_size = safe_batch_size(ex["batch_size"], cfg["seq_length"], ex["max_num_batched_tokens"])
        self.dtype = dtype
        self.generator = VllmHiddenStatesGenerator(
            cfg["target"]["path"], layer_ids=layer_ids, max_model_len=int(cfg["seq_length"]),
            gpu_memory_utilization=float(ex["gpu_memory_utilization"]),
            tensor_parallel_size=int(ex["tensor_parallel_size"]))

    def batches(self, samples):
        for i in range(0, len(samples), self.batch_size):
            yield samples[i : i + self.batch_size]

    def run(self, batch):
        results = self.generator.generate([s["input_ids"] for s in batch])
        out = []
        for s, r in zip(batch, results, strict=True):
            if r["input_ids"].tolist() != s["input_ids"]:
                raise PipelineError(f"extract: vLLM returned other tokens for sample {s['id']} "
                                    "(mis-sliced batch); lower eagle3_pipeline_extract_batch_size to 1.")
            out.append(r["hidden_states"])
        return out
