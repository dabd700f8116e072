"""Run a server that ends with its parent: python -m specdec_pipeline.vllm_launch CMD [ARG ...]

Every managed vLLM server (vllm_server.LAUNCHER: regenerate's, the current track's extraction server) is started
through this launcher so that a pipeline killed with SIGKILL (no clean-up code runs) leaves nothing holding GPUs
and memory. The launcher asks the kernel for SIGTERM when the pipeline process
ends (prctl PR_SET_PDEATHSIG), runs CMD as its child in its own process group, and on SIGTERM (the pipeline's
normal stop, or the pipeline's death) passes SIGTERM to CMD, waits briefly, then kills the whole process group:
vLLM's engine and worker processes, which outlive a killed API server on their own, included.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 20


def _ended(pid, timeout):
    """Whether PID ended (and was reaped) within TIMEOUT seconds. Not Popen.wait: the signal that runs stop() may
    interrupt the main thread inside child.wait(), which holds the Popen's wait lock - a second wait from the handler
    could then never reap the child and sat out the whole grace period (20 s added to every server stop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:  # reaped already
            return True
        time.sleep(0.05)
    return False


def main(argv):
    if not argv:
        print("usage: python -m specdec_pipeline.vllm_launch CMD [ARG ...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def stop(_signum=None, _frame=None):
        with contextlib.suppress(Exception):
            child.send_signal(signal.SIGTERM)
            _ended(child.pid, GRACE_S)
        os.killpg(0, signal.SIGKILL)  # every process the server started, this launcher last

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the pipeline's own stop still ends the group
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the pipeline ended before prctl took effect
        stop()
    rc = child.wait()
    # The server ended on its own (e.g. failed to start): end what it left behind, report its status.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGTERM)
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
