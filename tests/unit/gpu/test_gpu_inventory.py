"""gpu_inventory: nvidia-smi/modinfo parsing, the checks, the flavour refusal and the stand-alone CLI."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import gpu_inventory as gi  # noqa: E402  (imported from its file, the way the CLI runs it on a GPU host)

# Output lines in the format nvidia-smi prints for
# --query-gpu=index,name,compute_cap,driver_version,persistence_mode,memory.total --format=csv,noheader
RTX_PRO_8 = "".join(
    f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 580.82.07, Enabled, 97887 MiB\n" for i in range(8))
H200_1 = "0, NVIDIA H200, 9.0, 570.133.20, Enabled, 143771 MiB\n"
MIXED = ("0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 575.57.08, Disabled, 97887 MiB\n"
         "1, NVIDIA GeForce RTX 4090, 8.9, 575.57.08, Enabled, 24564 MiB\n")
MODINFO_OPEN = """filename:       /lib/modules/6.8.0-60-generic/updates/dkms/nvidia.ko.zst
import_ns:      DMA_BUF
alias:          char-major-195-*
version:        580.82.07
supported:      external
license:        Dual MIT/GPL
firmware:       nvidia/580.82.07/gsp_tu10x.bin
"""
MODINFO_PROPRIETARY = MODINFO_OPEN.replace("Dual MIT/GPL", "NVIDIA")


def test_parses_eight_blackwell_gpus():
    gpus = gi.parse_nvidia_smi_csv(RTX_PRO_8)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.compute_capability for g in gpus} == {"12.0"}
    assert gpus[3].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[0].driver_version == "580.82.07"
    assert gpus[0].persistence_mode is True
    assert gpus[0].memory_total_mib == 97887


def test_parses_output_captured_on_a_real_h200():
    # tests/unit/gpu/data/h200-nvidia-smi.csv: the query's output on an H200 host (driver 580.159.04).
    gpus = gi.parse_nvidia_smi_csv((Path(__file__).parent / "data" / "h200-nvidia-smi.csv").read_text())
    assert [(g.name, g.compute_capability, g.persistence_mode) for g in gpus] == [("NVIDIA H200", "9.0", True)]
    assert gi.check_inventory(gpus, expect_count=1, expect_cc="9.0", min_driver="580.65.06") == []


def test_memory_not_available_is_none_and_blank_lines_are_ignored():
    gpus = gi.parse_nvidia_smi_csv("\n0, NVIDIA H200, 9.0, 570.133.20, Disabled, [N/A]\n\n")
    assert len(gpus) == 1 and gpus[0].memory_total_mib is None and gpus[0].persistence_mode is False


@pytest.mark.parametrize("line, words", [
    ("0, NVIDIA A100-SXM4-80GB, 470.82.01, Enabled, 81920 MiB", "5 fields where 6"),
    ("0, Tesla V100, [N/A], 470.82.01, Enabled, 16384 MiB", "compute capability '[N/A]'"),
    ("0, NVIDIA H200, 9.0, 570.133.20, [Not Supported], 143771 MiB", "persistence mode '[Not Supported]'"),
    ("GPU 0, NVIDIA H200, 9.0, 570.133.20, Enabled, 143771 MiB", "instead of a GPU index"),
])
def test_unreadable_lines_raise_one_sentence(line, words):
    with pytest.raises(gi.GpuInventoryError) as err:
        gi.parse_nvidia_smi_csv(line)
    assert words in str(err.value)
    assert str(err.value).count("\n") == 0


def test_modinfo_license():
    assert gi.parse_modinfo_license(MODINFO_OPEN) == "Dual MIT/GPL"
    assert gi.parse_modinfo_license(MODINFO_PROPRIETARY) == "NVIDIA"
    assert gi.parse_modinfo_license("filename: x\n") == ""


def test_all_expectations_met_gives_no_problems():
    gpus = gi.parse_nvidia_smi_csv(RTX_PRO_8)
    assert gi.check_inventory(gpus, expect_count=8, expect_cc="12.0", expect_names=["RTX PRO 6000"],
                              min_driver="580.65.06", require_persistence=True,
                              module_license="Dual MIT/GPL") == []


def test_count_and_capability_mismatch_on_h200():
    problems = gi.check_inventory(gi.parse_nvidia_smi_csv(H200_1), expect_count=8, expect_cc="12.0")
    assert problems == ["nvidia-smi lists 1 GPU(s) but 8 are expected.",
                        "Compute capability 12.0 is expected but GPU 0 (NVIDIA H200) has 9.0."]


def test_names_driver_and_persistence_mismatch():
    gpus = gi.parse_nvidia_smi_csv(MIXED)
    problems = gi.check_inventory(gpus, expect_names=["RTX PRO 6000"], min_driver="580.65.06",
                                  require_persistence=True)
    assert problems == [
        "GPU names must contain one of ['RTX PRO 6000'] but GPU 1 is 'NVIDIA GeForce RTX 4090'.",
        "Driver 575.57.08 is older than the required 580.65.06.",
        "Persistence mode is off on GPU 0: enable nvidia-persistenced.",
    ]


def test_driver_versions_compare_numerically_not_as_text():
    gpus = gi.parse_nvidia_smi_csv("0, NVIDIA H200, 9.0, 580.105.08, Enabled, 143771 MiB\n")
    assert gi.check_inventory(gpus, min_driver="580.65.06") == []
    assert gi.check_inventory(gpus, min_driver="580.126.09") == ["Driver 580.105.08 is older than the required 580.126.09."]


def test_proprietary_module_on_blackwell_is_refused_with_the_flavour_sentence():
    problems = gi.check_inventory(gi.parse_nvidia_smi_csv(RTX_PRO_8), module_license="NVIDIA")
    assert len(problems) == 1
    assert "license 'NVIDIA', not the open modules' 'Dual MIT/GPL'" in problems[0]
    assert "do not support compute capability 12.0" in problems[0]


def test_proprietary_module_on_hopper_is_only_reported_as_not_open():
    problems = gi.check_inventory(gi.parse_nvidia_smi_csv(H200_1), module_license="NVIDIA")
    assert problems == ["The loaded nvidia kernel module has license 'NVIDIA', not the open modules' 'Dual MIT/GPL'."]


@pytest.mark.parametrize("flavour, ccs, refused", [
    ("proprietary", ["12.0"], True),
    ("proprietary", ["10.0"], True),
    ("proprietary", ["8.9", "12.0"], True),
    ("proprietary", ["9.0"], False),
    ("proprietary", [], False),
    ("open", ["12.0"], False),
])
def test_flavour_refusal(flavour, ccs, refused):
    message = gi.flavour_refusal(flavour, ccs)
    assert bool(message) is refused
    if refused:
        assert message.endswith("set the driver flavour to open.")


def test_bad_minimum_driver_is_one_sentence():
    with pytest.raises(gi.GpuInventoryError, match="not a dotted numeric version"):
        gi.check_inventory(gi.parse_nvidia_smi_csv(H200_1), min_driver="r580")


def test_table_lists_every_gpu():
    table = gi.format_table(gi.parse_nvidia_smi_csv(MIXED)).splitlines()
    assert table[0].split() == ["idx", "name", "cc", "driver", "persistence", "memory"]
    assert "NVIDIA GeForce RTX 4090" in table[2] and "8.9" in table[2] and "24564 MiB" in table[2]


def _fake_smi(tmp_path: Path, csv: str, rc: int = 0) -> Path:
    """An executable that prints nvidia-smi's CSV output (test input), checking it was asked the right query."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   f'[ "$1" = "{gi.NVIDIA_SMI_ARGS[0]}" ] && [ "$2" = "{gi.NVIDIA_SMI_ARGS[1]}" ] || exit 9\n'
                   f"cat <<'CSV'\n{csv}CSV\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _cli(*args: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "roles" / "gpu_verify" / "files" / "gpu_check.py"), *args],
                          capture_output=True, text=True, env={**os.environ, "PATH": path}, check=False)


def test_cli_passes_on_matching_h200(tmp_path):
    _fake_smi(tmp_path, H200_1)
    proc = _cli("--expect-count", "1", "--expect-cc", "9.0", path=f"{tmp_path}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stdout
    assert "NVIDIA H200" in proc.stdout and proc.stdout.rstrip().endswith("OK: 1 GPU(s) match.")


def test_cli_fails_with_one_line_on_mismatch(tmp_path):
    _fake_smi(tmp_path, H200_1)
    proc = _cli("--expect-count", "1", "--expect-cc", "12.0", path=f"{tmp_path}:/usr/bin:/bin")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "Compute capability 12.0 is expected but GPU 0 (NVIDIA H200) has 9.0."


def test_cli_without_nvidia_smi(tmp_path):
    proc = _cli("--expect-count", "1", path=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout.strip() == ("No NVIDIA GPU can be checked: nvidia-smi is not installed "
                                   "(install the NVIDIA driver first).")


def test_cli_reports_a_failing_nvidia_smi(tmp_path):
    _fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", rc=9)
    proc = _cli(path=f"{tmp_path}:/usr/bin:/bin")
    assert proc.returncode == 2
    assert "exited 9 (NVIDIA-SMI has failed because it couldn't communicate" in proc.stdout
