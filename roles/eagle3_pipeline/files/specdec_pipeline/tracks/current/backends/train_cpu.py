"""`speculators train` on a host without an accelerator (the CPU profile of the current track only).

speculators 0.9.0's trainer moves the model and each batch to `local_rank` (an accelerator index) and calls
`torch.accelerator.synchronize()`. Without an accelerator both fail, so this launcher - in this process only,
nothing on disk changes - makes the trainer's local rank the CPU device and the synchronize call a no-op, then
runs the trainer's own entry point with the given arguments. Use it with `--draft-attn-impl sdpa
--loss-implementation eager` (flex attention backward and the fused Triton loss need a GPU). On a GPU host
the pipeline runs `python -m speculators.train` (or torchrun) directly.
"""

import runpy
import sys


def main(argv):
    import torch  # noqa: PLC0415

    if torch.accelerator.is_available():
        print("train_cpu: an accelerator is present; run `python -m speculators.train` instead.",
              file=sys.stderr)
        return 2
    import speculators.train.distributed as dist_mod  # noqa: PLC0415
    import speculators.train.trainer as trainer_mod  # noqa: PLC0415

    def cpu_rank():
        return torch.device("cpu")

    dist_mod.get_local_rank = cpu_rank
    trainer_mod.get_local_rank = cpu_rank
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    sys.argv = ["speculators.train", *argv]
    runpy.run_module("speculators.train", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
