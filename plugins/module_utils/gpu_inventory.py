# -*- coding: utf-8 -*-
# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU inventory from nvidia-smi and modinfo, and the checks the GPU stack relies on.

No Ansible imports and no process handling: the query functions take a runner, a callable that runs an
argv list and returns ``(rc, stdout, stderr)``. The module ``specdec.eagle3.gpu_facts`` passes one built
on ``run_command``; on a GPU host without Ansible the stand-alone check loads this file and passes one
built on subprocess::

    python3 roles/gpu_verify/files/gpu_check.py --expect-count 1 --expect-cc 9.0
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass
from typing import Callable, List, Tuple

QUERY_FIELDS = ("index", "name", "compute_cap", "driver_version", "persistence_mode", "memory.total")
NVIDIA_SMI_ARGS = ("--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader")
OPEN_MODULE_LICENSE = "Dual MIT/GPL"
# First compute capability major that the proprietary kernel modules do not drive (Blackwell).
OPEN_ONLY_FROM_MAJOR = 10
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
_CC_RE = re.compile(r"^\d+\.\d+$")


class GpuInventoryError(Exception):
    """nvidia-smi or modinfo output that cannot be read; the message is one sentence."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str
    driver_version: str
    persistence_mode: bool
    memory_total_mib: int | None


def _mib(text: str) -> int | None:
    match = re.match(r"^(\d+)\s*MiB$", text)
    return int(match.group(1)) if match else None


def parse_nvidia_smi_csv(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader`` output, one GPU a line."""
    gpus = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise GpuInventoryError(
                f"nvidia-smi line {lineno} has {len(cells)} fields where {len(QUERY_FIELDS)} "
                f"({', '.join(QUERY_FIELDS)}) were expected: {line.strip()!r}; a driver older than 510 lacks "
                "compute_cap, so install a current driver.")
        index, name, cc, driver, persistence, memory = cells
        if not index.isdigit():
            raise GpuInventoryError(f"nvidia-smi line {lineno} starts with {index!r} instead of a GPU index.")
        if not _CC_RE.match(cc):
            raise GpuInventoryError(
                f"nvidia-smi reports compute capability {cc!r} for GPU {index} ({name}); expected MAJOR.MINOR "
                "such as 12.0, which drivers from 510 on report.")
        if persistence not in ("Enabled", "Disabled"):
            raise GpuInventoryError(
                f"nvidia-smi reports persistence mode {persistence!r} for GPU {index}; expected Enabled or Disabled.")
        gpus.append(Gpu(int(index), name, cc, driver, persistence == "Enabled", _mib(memory)))
    return gpus


def parse_modinfo_license(text: str) -> str:
    """Return the ``license:`` field of ``modinfo nvidia`` output ('' when there is none)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "license":
            return value.strip()
    return ""


def version_tuple(version: str) -> tuple[int, ...]:
    if not _VERSION_RE.match(version.strip()):
        raise GpuInventoryError(f"{version!r} is not a dotted numeric version such as 580.65.06.")
    return tuple(int(part) for part in version.strip().split("."))


def cc_major(compute_capability: str) -> int:
    return int(compute_capability.split(".", 1)[0])


def flavour_refusal(flavour: str, compute_capabilities: list[str]) -> str:
    """Return why ``flavour`` cannot drive GPUs of these capabilities ('' when it can)."""
    if flavour != "proprietary":
        return ""
    blackwell = sorted({cc for cc in compute_capabilities if cc_major(cc) >= OPEN_ONLY_FROM_MAJOR})
    if not blackwell:
        return ""
    return (f"The proprietary NVIDIA kernel modules do not support compute capability {', '.join(blackwell)} "
            "(Blackwell and newer need the open modules): set the driver flavour to open.")


def check_inventory(gpus: list[Gpu], *, expect_count: int | None = None, expect_cc: str | None = None,
                    expect_names: list[str] | None = None, min_driver: str | None = None,
                    require_persistence: bool = False, module_license: str | None = None) -> list[str]:
    """Return one sentence per mismatch between the GPUs found and what is expected (empty when all match).

    ``expect_names`` are substrings that every GPU's name must contain one of; ``module_license`` is the
    license of the loaded nvidia module (None skips the open-module check).
    """
    problems = []
    if expect_count is not None and len(gpus) != expect_count:
        problems.append(f"nvidia-smi lists {len(gpus)} GPU(s) but {expect_count} are expected.")
    if expect_cc:
        wrong = [f"GPU {g.index} ({g.name}) has {g.compute_capability}" for g in gpus if g.compute_capability != expect_cc]
        if wrong:
            problems.append(f"Compute capability {expect_cc} is expected but {'; '.join(wrong)}.")
    if expect_names:
        wrong = [f"GPU {g.index} is {g.name!r}" for g in gpus if not any(n in g.name for n in expect_names)]
        if wrong:
            problems.append(f"GPU names must contain one of {expect_names} but {'; '.join(wrong)}.")
    if min_driver:
        floor = version_tuple(min_driver)
        old = sorted({g.driver_version for g in gpus if version_tuple(g.driver_version) < floor})
        if old:
            problems.append(f"Driver {', '.join(old)} is older than the required {min_driver}.")
    if require_persistence:
        off = [str(g.index) for g in gpus if not g.persistence_mode]
        if off:
            problems.append(f"Persistence mode is off on GPU {', '.join(off)}: enable nvidia-persistenced.")
    if module_license is not None and gpus:
        if module_license != OPEN_MODULE_LICENSE:
            refusal = flavour_refusal("proprietary", [g.compute_capability for g in gpus])
            problems.append(
                f"The loaded nvidia kernel module has license {module_license or 'unknown'!r}, not the open "
                f"modules' {OPEN_MODULE_LICENSE!r}" + (f"; {refusal[0].lower()}{refusal[1:]}" if refusal else "."))
    return problems


# Runs an argv list and returns (exit status, stdout, stderr).
Runner = Callable[[List[str]], Tuple[int, str, str]]


def query_gpus(runner: Runner, nvidia_smi: str = "nvidia-smi") -> list[Gpu]:
    """Run nvidia-smi through ``runner`` and parse it; raise FileNotFoundError when it is not installed."""
    path = shutil.which(nvidia_smi)
    if path is None:
        raise FileNotFoundError(nvidia_smi)
    rc, stdout, stderr = runner([path, *NVIDIA_SMI_ARGS])
    if rc != 0:
        detail = (stdout + stderr).strip().splitlines()
        raise GpuInventoryError(
            f"{path} exited {rc} ({detail[0] if detail else 'no output'}); the driver is not loaded "
            "or does not match the kernel: check dkms status and reboot after a driver install.")
    return parse_nvidia_smi_csv(stdout)


def query_module_license(runner: Runner, modinfo: str = "modinfo", module: str = "nvidia") -> str | None:
    """License of the installed nvidia module, or None when modinfo or the module is missing."""
    path = shutil.which(modinfo) or next((p for p in ("/usr/sbin/modinfo", "/sbin/modinfo") if shutil.which(p)), None)
    if path is None:
        return None
    rc, stdout, dummy = runner([path, module])
    if rc != 0:
        return None
    return parse_modinfo_license(stdout)


def format_table(gpus: list[Gpu]) -> str:
    rows = [("idx", "name", "cc", "driver", "persistence", "memory")]
    rows += [(str(g.index), g.name, g.compute_capability, g.driver_version,
              "on" if g.persistence_mode else "off",
              f"{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "n/a") for g in gpus]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def as_dicts(gpus: list[Gpu]) -> list[dict]:
    return [asdict(g) for g in gpus]
