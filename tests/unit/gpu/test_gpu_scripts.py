"""The torch probe and the all-reduce script of gpu_verify, run with the real torch (skipped where torch is absent).

On a CPU-only machine the probe must report no GPU; the gloo all-reduce runs real torch.distributed processes.
On a GPU machine (`--gpu-count N --gpu-cc X.Y` via environment) the NCCL path runs too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
FILES = Path(__file__).resolve().parents[3] / "roles" / "gpu_verify" / "files"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _run(script: str, *args: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FILES / script), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def _cc() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def test_probe_accepts_what_torch_sees():
    args = ["--expect-count", str(GPUS), "--expect-cc", _cc() if GPUS else "12.0"]
    proc = _run("torch_probe.py", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert len(seen["devices"]) == GPUS and seen["torch"] == torch.__version__


def test_probe_refuses_one_gpu_more_than_present():
    proc = _run("torch_probe.py", "--expect-count", str(GPUS + 1), "--expect-cc", "12.0")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {GPUS} GPU(s)")


@pytest.mark.skipif(GPUS == 0, reason="needs a GPU")
def test_probe_refuses_the_wrong_capability():
    proc = _run("torch_probe.py", "--expect-count", str(GPUS), "--expect-cc", "12.0" if _cc() != "12.0" else "9.0")
    assert proc.returncode == 1 and "where compute capability" in proc.stdout.splitlines()[-1]


def test_gloo_all_reduce_across_three_processes():
    proc = _run("nccl_allreduce.py", "--backend", "gloo", "--world-size", "3", "--timeout", "120", "--numel", "1024")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[0])
    assert result["world_size"] == 3 and all(r[0] for r in result["results"].values())


@pytest.mark.skipif(GPUS == 0, reason="needs a GPU")
@pytest.mark.parametrize("p2p", ["0", "1"])
def test_nccl_all_reduce_across_every_gpu(p2p):
    proc = _run("nccl_allreduce.py", "--timeout", "120", env={"NCCL_P2P_DISABLE": p2p})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[0])
    assert result["world_size"] == GPUS and result["NCCL_P2P_DISABLE"] == p2p


@pytest.mark.skipif(GPUS == 0, reason="needs a GPU")
def test_nccl_with_more_ranks_than_gpus_fails_fast_with_the_rank_error():
    proc = _run("nccl_allreduce.py", "--world-size", str(GPUS + 1), "--timeout", "60")
    assert proc.returncode == 1
    assert f"failed on rank {GPUS}:" in proc.stdout.splitlines()[-1]
