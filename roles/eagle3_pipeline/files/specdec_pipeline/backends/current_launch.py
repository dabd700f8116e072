"""Exec a command that dies with its parent: python -m specdec_pipeline.backends.current_launch CMD [ARG ...]

The extraction server is started through this launcher so that a pipeline killed with SIGKILL (no clean-up
code runs) does not leave the server holding GPUs and memory: the kernel sends SIGKILL to the server when the
pipeline process ends (prctl PR_SET_PDEATHSIG). vLLM's own worker processes end with the server.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv):
    if not argv:
        print("usage: python -m specdec_pipeline.backends.current_launch CMD [ARG ...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pipeline's own stop still ends the group
        pass
    if os.getppid() != parent:  # the parent ended before prctl took effect
        return 1
    os.execvp(argv[0], argv)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
