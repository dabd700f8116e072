"""Wall time of the static speculators <-> vLLM compatibility check (specdec.eagle3.vllm_compat) on the
speculators 0.3.0 wheel x vLLM 0.16.0 sources (real release files laid out as a venv), unpatched and patched,
beside the figure it replaces: one ~18 min load of the 547 GB model per discovered error.

    python benchmarks/bench_compat.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collections"), str(ROOT)]

import yaml  # noqa: E402

from ansible_collections.specdec.eagle3.plugins.module_utils import compat  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402

MODEL_LOAD_MIN = 18


def runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def layout(tmp, spec, vllm):
    venv = Path(tmp) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(fetch("speculators", spec, "wheel")) as whl:
        whl.extractall(site)
    prefix = "vllm-%s/" % vllm
    with tarfile.open(fetch("vllm", vllm, "sdist")) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + "vllm/")]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(site, members=members)
    info = site / ("vllm-%s.dist-info" % vllm)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % vllm)
    return str(venv / "bin" / "python")


def check(python):
    """What the module does: ask the interpreter where the packages are, then scan speculators."""
    env = inspect(python, {"speculators", "vllm"}, {"speculators", "vllm"}, runner)
    return compat.check_package(SourceTree(env.roots), env.info["packages"]["speculators"], "vllm")


def module_call(python):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m",
           "specdec.eagle3.vllm_compat", "-a", "python=%s report_only=true" % python]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), check=False)
    wall = time.perf_counter() - t0
    return wall, json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["summary"]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        python = layout(tmp, "0.3.0", "0.16.0")
        t0 = time.perf_counter()
        unpatched = check(python)
        t_unpatched = time.perf_counter() - t0
        broken = sum(f.state == "broken" for f in unpatched)
        t_module, summary = module_call(python)

        patches = yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
        env = inspect(python, {"speculators", "vllm"}, {"speculators", "vllm"}, runner)
        out = run(patches, env, SourceTree(env.roots), "present")
        assert "failed" not in out, out.get("msg")
        t0 = time.perf_counter()
        patched = check(python)
        t_patched = time.perf_counter() - t0

        print("vllm_compat engine, unpatched speculators 0.3.0 vs vLLM 0.16.0: %.2f s (target < 5 s), %d breaks found"
              " -> replaces %d model loads of ~%d min (~%d min)" % (t_unpatched, broken, broken, MODEL_LOAD_MIN,
                                                                    broken * MODEL_LOAD_MIN))
        print("vllm_compat module through ansible (process start included): %.2f s -> %s" % (t_module, summary))
        print("vllm_compat engine, patched speculators 0.3.0 vs vLLM 0.16.0: %.2f s -> %s"
              % (t_patched, compat.summary(patched)))
        print("cpus: %s" % os.cpu_count())


if __name__ == "__main__":
    main()
