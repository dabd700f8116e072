"""The hidden-states KV connector for vLLM's CPU build (the CPU profile of the current track).

vLLM's ExampleHiddenStatesConnector copies each finished request's hidden states through a CUDA stream into
pinned memory, which a CPU-only host cannot do. This subclass keeps everything else of it (scheduler side,
lock files, file names, what the server returns in kv_transfer_params) and replaces only the per-request
write: gather the request's rows from the hidden-state cache on the CPU and write the safetensors file
synchronously, as bf16 (whatever dtype the server computes in: a CPU profile may serve its target in float32,
which a CPU without native bf16 runs far faster) or - with kv_connector_extra_config {"specdec_storage": "fp8"} - in hs-connectors' FP8
layout (float8_e4m3fn values with one float32 scale per token), so the training side reads both formats the
same way as on a GPU host. Loaded by the server through kv_connector_module_path.
"""

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
)


class _Done:
    """Stands in for the CUDA event the parent polls: the write has finished when it is recorded."""

    @staticmethod
    def query():
        return True

    @staticmethod
    def synchronize():
        return None


def gather_rows(cache, block_ids, block_size, num_tokens):
    """Rows [num_tokens, layers, hidden] of a request from a [blocks, layers, block_size, hidden] cache."""
    blocks = torch.as_tensor(block_ids, dtype=torch.long)
    slots = (blocks.reshape(-1, 1) * block_size + torch.arange(block_size, dtype=torch.long).reshape(1, -1)).flatten()
    slots = slots[:num_tokens]
    return cache[slots // block_size, :, slots % block_size].clone()


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending):
        if not self._is_tp_rank_zero:
            return
        hidden = gather_rows(self._kv_cache, pending.block_ids, self._block_size, pending.token_ids.shape[0])
        tensors = {"token_ids": pending.token_ids.clone()}
        if self._kv_transfer_config.get_from_extra_config("specdec_storage", "bf16") == "fp8":
            from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8  # noqa: PLC0415

            tensors["hidden_states"], tensors[SCALES_KEY] = quantize_tensor_to_fp8(hidden)
        else:
            tensors["hidden_states"] = hidden.to(torch.bfloat16)
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
