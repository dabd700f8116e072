# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU check without Ansible: the checks of specdec.eagle3.gpu_facts on a GPU host, from the command line.

    python3 roles/gpu_verify/files/gpu_check.py --expect-count 1 --expect-cc 9.0

It loads ``gpu_inventory.py`` (the parsing and the checks) from the same folder when a copy lies beside it,
else from the collection's ``plugins/module_utils``, and runs nvidia-smi and modinfo through subprocess.
It prints a table of the GPUs and exits 0, or prints one sentence that says what does not match and exits 1
(2 when nvidia-smi cannot be run at all).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANDIDATES = (HERE / "gpu_inventory.py", HERE.parent.parent.parent / "plugins" / "module_utils" / "gpu_inventory.py")
TIMEOUT_S = 60


def load_gpu_inventory():
    """Import gpu_inventory.py by its path (it has no Ansible imports)."""
    path = next((p for p in CANDIDATES if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(" or ".join(str(p) for p in CANDIDATES))
    spec = importlib.util.spec_from_file_location("gpu_inventory", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_inventory"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def run(argv: list[str]) -> tuple[int, str, str]:
    """The runner gpu_inventory's query functions call: argv -> (exit status, stdout, stderr)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def say(message) -> None:
    """Write one line of the report."""
    sys.stdout.write(f"{message}\n")


def main(argv: list[str] | None = None) -> int:
    try:
        gi = load_gpu_inventory()
    except FileNotFoundError as exc:
        say(f"gpu_inventory.py was not found at {exc}: copy it beside this script or run the script from the collection.")
        return 2
    parser = argparse.ArgumentParser(description="List the NVIDIA GPUs and check them against expectations.")
    parser.add_argument("--expect-count", type=int, help="number of GPUs that must be present")
    parser.add_argument("--expect-cc", help="compute capability every GPU must have, e.g. 12.0")
    parser.add_argument("--expect-name", action="append", help="substring a GPU name must contain (repeatable)")
    parser.add_argument("--min-driver", help="oldest acceptable driver version, e.g. 580.65.06")
    parser.add_argument("--require-persistence", action="store_true", help="every GPU must have persistence mode on")
    parser.add_argument("--require-open-modules", action="store_true",
                        help=f"the nvidia kernel module must carry the open modules' license ({gi.OPEN_MODULE_LICENSE})")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi executable")
    args = parser.parse_args(argv)
    try:
        gpus = gi.query_gpus(run, args.nvidia_smi)
    except FileNotFoundError:
        say(f"No NVIDIA GPU can be checked: {args.nvidia_smi} is not installed (install the NVIDIA driver first).")
        return 2
    except (gi.GpuInventoryError, subprocess.TimeoutExpired) as exc:
        say(exc)
        return 2
    say(gi.format_table(gpus))
    license_ = gi.query_module_license(run) if args.require_open_modules else None
    if args.require_open_modules and license_ is None:
        say("modinfo nvidia found no nvidia kernel module to check the license of.")
        return 1
    try:
        problems = gi.check_inventory(gpus, expect_count=args.expect_count, expect_cc=args.expect_cc,
                                      expect_names=args.expect_name, min_driver=args.min_driver,
                                      require_persistence=args.require_persistence, module_license=license_)
    except gi.GpuInventoryError as exc:
        say(exc)
        return 2
    if problems:
        say(" ".join(problems))
        return 1
    say(f"OK: {len(gpus)} GPU(s) match.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
