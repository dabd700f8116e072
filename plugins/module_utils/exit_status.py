# -*- coding: utf-8 -*-
# Copyright (c) specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a child process ended, in words: a signal is named, not left as a number.

A child killed by signal N shows up as returncode -N (Python's subprocess, Ansible's run_command) or as status
128+N when a shell ran it (Ansible's shell and async tasks, ``bash -c``).  ``exit_text(132)`` gives
``was killed by SIGILL (signal 4; its shell reported status 132) - the CPU lacks an instruction ...``.
Standard library only: the collection's filter plugin, its modules and the test helpers share it.
"""

from __future__ import annotations

import signal

# What a signal usually means for the programs the collection runs (vLLM, torch, the trainer).
HINTS = {
    "SIGILL": "the CPU lacks an instruction the program uses (a build made for newer instruction sets than this "
              "CPU's /proc/cpuinfo flags, e.g. an AVX-512 build on an AVX2-only CPU)",
    "SIGKILL": "sent from outside the program, often by the kernel's out-of-memory killer (dmesg says which)",
    "SIGSEGV": "the program crashed on an invalid memory access",
    "SIGBUS": "the program crashed on a bus error (often a full /dev/shm or a truncated memory-mapped file)",
    "SIGABRT": "the program aborted itself; the end of its log says why",
}


def signal_of(status):
    """The number of the signal that ended a child, or None: status -N, or 128+N as a shell reports it."""
    try:
        status = int(status)
    except (TypeError, ValueError):
        return None
    if status < 0:
        number = -status
    elif status > 128:
        number = status - 128
    else:
        return None
    return number if number in {int(s) for s in signal.valid_signals()} else None


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def exit_text(status):
    """``exited with status 1``, or ``was killed by SIGILL (signal 4) - <what that usually means>``."""
    number = signal_of(status)
    if number is None:
        return "exited with status %s" % status
    name = signal_name(number)
    how = "signal %d" % number if int(status) < 0 else "signal %d; its shell reported status %d" % (number, int(status))
    hint = HINTS.get(name)
    return "was killed by %s (%s)%s" % (name, how, (" - " + hint) if hint else "")
