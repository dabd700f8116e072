"""speculators 0.3.0 patched for one of vLLM's CPU builds, laid out beside (not inside) that build's venv.

A throwaway venv holds the speculators copy and sees the CPU build's venv through a .pth file, so the patch
engine decides every patch from that vLLM's code; extraction then runs the CPU build's interpreter with the
copy first on PYTHONPATH (vLLM's spawned workers inherit it).  One cached venv per vLLM serves every
patch combination.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "collections"), str(ROOT)]

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run as patch_run  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402


def _runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def build(dest, vllm_python, without=None, set_name="speculators_0_3_0", spec_version="0.3.0"):
    """Patch a speculators copy in DEST with the set minus the patch whose id starts with WITHOUT.

    Returns (site dir to put on PYTHONPATH, {patch id prefix: state}).
    """
    dest = Path(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = next((dest / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(fetch("speculators", spec_version, "wheel")) as whl:
        whl.extractall(site)
    vsite = subprocess.run([str(vllm_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (site / "specdec-vllm.pth").write_text(vsite + "\n")
    patches = yaml.safe_load((ROOT / "patch_sets" / (set_name + ".yml")).read_text())["patches"]
    env = inspect(str(dest / "bin" / "python"), {"speculators", "vllm"}, {"speculators", "vllm"}, _runner)
    chosen = [p for p in patches if not (without and p["id"].startswith(without))]
    out = patch_run(chosen, env, SourceTree(env.roots), "present")
    if out.get("failed"):
        raise RuntimeError(out.get("msg"))
    return site, {r["id"][:3]: r["state"] for r in out["results"]}
