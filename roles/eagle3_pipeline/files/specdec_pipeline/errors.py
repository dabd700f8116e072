"""The one exception type the CLI turns into a single clear line."""


class PipelineError(Exception):
    """Bad input or a failed check: the message names the file, what was expected and what to do."""


def unexpected_error_line(exc, log_path):
    """For a bug or an unforeseen failure: append the traceback to the file LOG_PATH() names and return the one
    ``ERROR: `` line the Ansible roles show; where that log cannot be written the traceback goes to stderr."""
    import traceback  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    try:
        path = Path(log_path())
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(traceback.format_exc())
    except Exception:  # noqa: BLE001 - nowhere to write it: show it
        traceback.print_exc()
        path = "the output above"
    return f"ERROR: unexpected {type(exc).__name__}: {exc}; the traceback is in {path}."


class StopAfter(Exception):  # noqa: N818 - a planned stop, not an error
    """The run stops on purpose (e.g. no training possible on this machine); the message says why."""


# How a child ended, with a signal named: the pipeline's copy of the collection's module_utils/exit_status.py
# (this package runs on the host without the collection; tests/unit/test_exit_status.py keeps the two equal).
_HINTS = {
    "SIGILL": "the CPU lacks an instruction the program uses (a build made for newer instruction sets than this "
              "CPU's /proc/cpuinfo flags, e.g. an AVX-512 build on an AVX2-only CPU)",
    "SIGKILL": "sent from outside the program, often by the kernel's out-of-memory killer (dmesg says which)",
    "SIGSEGV": "the program crashed on an invalid memory access",
    "SIGBUS": "the program crashed on a bus error (often a full /dev/shm or a truncated memory-mapped file)",
    "SIGABRT": "the program aborted itself; the end of its log says why",
}


def exit_text(status):
    """``exited with status 1``, or ``was killed by SIGILL (signal 4) - <what that usually means>`` for a status
    of -N (subprocess) or 128+N (a shell's report of its child killed by signal N)."""
    import signal  # noqa: PLC0415

    try:
        status = int(status)
    except (TypeError, ValueError):
        return f"exited with status {status}"
    number = -status if status < 0 else status - 128 if status > 128 else None
    if number is None or number not in {int(s) for s in signal.valid_signals()}:
        return f"exited with status {status}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    how = f"signal {number}" if status < 0 else f"signal {number}; its shell reported status {status}"
    hint = _HINTS.get(name)
    return f"was killed by {name} ({how})" + (f" - {hint}" if hint else "")
