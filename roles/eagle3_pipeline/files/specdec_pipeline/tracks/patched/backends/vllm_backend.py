"""vLLM backend for extract: speculators' VllmHiddenStatesGenerator (patched by the patch stage).

Runs on vLLM's CUDA build (GPU) and on its CPU builds (no GPU; see docs/cpu.md).

Three things the generator does not do for us:
- Length: it cuts every prompt to max_model_len - 1 (room for the one token it samples), so it is built with
  config.max_model_len (seq_length + 1); a sample of exactly seq_length tokens then stays whole.
- Batching: it concatenates the captured states of every scheduler step and slices them by prompt length in
  request order.  That is only right when every request is prefilled whole in one step, in order; a request
  split over steps (more tokens than the step budget, speculators issue #279) is aborted after its first
  chunk and shifts every later sample.  Batches are packed from the budget the generator really uses
  (its scheduler's max_num_batched_tokens and max_num_seqs), and every generate() call is checked against
  the scheduler's actual plan: a request not scheduled whole, or out of order, fails the run.
- CPU hosts: it sizes the KV cache from torch.cuda.mem_get_info(); without a GPU that question is answered
  so that the cache gets VLLM_CPU_KVCACHE_SPACE GiB (vLLM's own CPU setting; default 1 here).
"""

import contextlib
import os

from specdec_pipeline import config, remote_code
from specdec_pipeline.errors import PipelineError

DEFAULT_CPU_KVCACHE_GIB = 1


def pack(samples, token_budget, max_seqs, batch_size):
    """Consecutive batches whose prompts sum to <= token_budget tokens and hold <= min(max_seqs, batch_size)."""
    cap = max(1, min(int(batch_size), int(max_seqs)))
    batch, tokens = [], 0
    for s in samples:
        n = len(s["input_ids"])
        if n > token_budget:
            raise PipelineError(f"extract: sample {s['id']} has {n} tokens, more than the generator's step budget "
                                f"of {token_budget}; lower seq_length.")
        if batch and (len(batch) == cap or tokens + n > token_budget):
            yield batch
            batch, tokens = [], 0
        batch.append(s)
        tokens += n
    if batch:
        yield batch


def check_plan(plan, lengths):
    """None when the scheduler prefilled request i (id ending in _i) whole, in one step, in index order.

    PLAN: one {request_id: tokens} per scheduler step, in step order.  Otherwise a sentence saying what
    went wrong (the captured hidden states would be sliced wrongly).
    """
    seen = []
    for step, scheduled in enumerate(plan):
        for req_id, n in scheduled.items():
            idx = int(str(req_id).rsplit("_", 1)[1])
            if not 0 <= idx < len(lengths):
                return f"step {step} scheduled unknown request {req_id}"
            if n != lengths[idx]:
                return (f"request {idx} ({lengths[idx]} tokens) was scheduled {n} tokens in step {step} "
                        "(split over steps)")
            seen.append(idx)
    if seen != list(range(len(lengths))):
        return f"requests were prefilled in the order {seen}, expected {list(range(len(lengths)))}"
    return None


@contextlib.contextmanager
def _cpu_memory_answer(torch, fraction, utilization):
    """Answer torch.cuda.mem_get_info() on a host without a GPU so that the generator's KV cache
    (free x utilization x fraction) is VLLM_CPU_KVCACHE_SPACE GiB."""
    raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(DEFAULT_CPU_KVCACHE_GIB)
    try:
        gib = float(raw)
    except ValueError:
        raise PipelineError(f"VLLM_CPU_KVCACHE_SPACE is {raw!r}: expected the KV cache size in GiB, e.g. 1.") from None
    if gib <= 0:
        raise PipelineError(f"VLLM_CPU_KVCACHE_SPACE is {raw!r}: expected a positive number of GiB.")
    free = int(gib * (1 << 30) / (utilization * fraction))
    saved = torch.cuda.mem_get_info
    torch.cuda.mem_get_info = lambda *_a, **_k: (free, free)
    try:
        yield
    finally:
        torch.cuda.mem_get_info = saved


class VllmBackend:
    def __init__(self, cfg, layer_ids, dtype):
        # vLLM starts its workers with spawn (the caller's __main__ must be guarded); the target is local
        # (HF_HUB_OFFLINE=1); the patched generator reads the trust_remote_code switch (remote_code.SWITCH_ENV).
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.update(remote_code.switch_env(cfg))
        import torch  # noqa: PLC0415

        try:
            from speculators.data_generation import vllm_hidden_states_generator as gen  # noqa: PLC0415
        except ImportError as exc:
            raise PipelineError(f"extract backend vllm: cannot import speculators' generator ({exc}); install vLLM "
                                "in the ML venv (stack stage) or use extract.backend=transformers.") from None
        ex = cfg["extract"]
        self.dtype = dtype
        utilization = float(ex["gpu_memory_utilization"])
        on_cpu = not torch.cuda.is_available()
        sizing = (_cpu_memory_answer(torch, float(getattr(gen, "CACHE_MEMORY_FRACTION", 0.2)), utilization)
                  if on_cpu else contextlib.nullcontext())
        with sizing:
            self.generator = gen.VllmHiddenStatesGenerator(
                cfg["target"]["path"], layer_ids=layer_ids, max_model_len=config.max_model_len(cfg),
                gpu_memory_utilization=utilization, tensor_parallel_size=int(ex["tensor_parallel_size"]))
        sched = self.generator.vllm_config.scheduler_config
        self.token_budget = int(sched.max_num_batched_tokens)
        self.max_seqs = int(sched.max_num_seqs)
        self.batch_size = int(ex["batch_size"])
        self.configured_budget = int(ex["max_num_batched_tokens"])
        self.plan = []
        scheduler = self.generator.scheduler
        schedule = scheduler.schedule

        def recording_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            if out.total_num_scheduled_tokens > 0:
                self.plan.append(dict(out.num_scheduled_tokens))
            return out

        scheduler.schedule = recording_schedule

    def batches(self, samples):
        # The generator's own budget, not a profile setting: what its scheduler really schedules per step.
        # The profile's max_num_batched_tokens can only lower it.
        budget = min(self.token_budget, self.configured_budget,
                     int(getattr(self.generator.scheduler, "max_num_scheduled_tokens", self.token_budget)))
        yield from pack(samples, budget, self.max_seqs, self.batch_size)

    def run(self, batch):
        lengths = [len(s["input_ids"]) for s in batch]
        self.plan = []
        results = self.generator.generate([s["input_ids"] for s in batch])
        problem = check_plan(self.plan, lengths)
        if problem is None:
            for s, r in zip(batch, results, strict=True):
                bad = [tuple(h.shape) for h in r["hidden_states"] if h.shape[0] != len(s["input_ids"])]
                if r["input_ids"].tolist() != s["input_ids"] or bad:
                    problem = f"sample {s['id']} came back with {len(r['input_ids'])} tokens / states {bad}"
                    break
        if problem:
            ids = [s["id"] for s in batch]
            raise PipelineError(f"extract: vLLM mis-sliced the batch of samples {ids}: {problem}; its hidden states "
                                "would belong to other tokens. Lower eagle3_pipeline_extract_batch_size (1 is always "
                                "safe).")
        return [r["hidden_states"] for r in results]

    def close(self):
        executor = getattr(self.generator, "executor", None)
        if executor is not None:
            executor.shutdown()
