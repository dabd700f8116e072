"""Test-only: lets speculators 0.3.0's torchrun path run on a machine without an accelerator (gloo, CPU).

Python imports this file at start-up when its folder is on PYTHONPATH; tests/multiproc puts it there for the
torchrun processes it starts and nowhere else. Nothing in the collection uses it, and speculators' installed
files are not changed. Each redirect applies only where no accelerator exists; with one, torch's own function runs.

- speculators/train/utils.py maybe_setup_distributed calls torch.accelerator.set_device_index(local_rank), which
  raises "Cannot access accelerator device when none is available." -> a no-op without an accelerator;
- the same function then needs torch.accelerator.current_accelerator() to be a device ("No accelerator found"
  otherwise) to pick the backend -> the CPU device, for callers in speculators.train.utils only, so that
  torch.distributed.get_default_backend_for_device gives gloo;
- it passes device_id=local_rank to init_process_group, which an int accepts only with an accelerator -> dropped;
- speculators/train/trainer.py Trainer.setup_model calls to_empty(device="cuda") on each FSDP-sharded layer ->
  the CPU when torch has no CUDA.
"""

import sys

import torch
import torch.distributed

_current_accelerator = torch.accelerator.current_accelerator
_set_device_index = torch.accelerator.set_device_index
_init_process_group = torch.distributed.init_process_group
_to_empty = torch.nn.Module.to_empty


def current_accelerator(*args, **kwargs):
    acc = _current_accelerator(*args, **kwargs)
    if acc is None and sys._getframe(1).f_globals.get("__name__") == "speculators.train.utils":  # noqa: SLF001
        return torch.device("cpu")
    return acc


def set_device_index(device_index):
    if torch.accelerator.is_available():
        _set_device_index(device_index)


def init_process_group(*args, **kwargs):
    if _current_accelerator() is None and isinstance(kwargs.get("device_id"), int):
        kwargs.pop("device_id")
    return _init_process_group(*args, **kwargs)


def to_empty(self, *, device, recurse=True):
    if device is not None and torch.device(device).type == "cuda" and not torch.cuda.is_available():
        device = "cpu"
    return _to_empty(self, device=device, recurse=recurse)


torch.accelerator.current_accelerator = current_accelerator
torch.accelerator.set_device_index = set_device_index
torch.distributed.init_process_group = init_process_group
torch.nn.Module.to_empty = to_empty
