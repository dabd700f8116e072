"""Wall time of one source_patch call asserting the whole speculators 0.3.0 set against vLLM 0.16.0 sources,
and of the static compatibility check on the same pair (real wheel + real sdist, laid out as a venv).

    python benchmarks/bench_source_patch.py
"""

from __future__ import annotations

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


def runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def main():
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        with zipfile.ZipFile(fetch("speculators", "0.3.0", "wheel")) as whl:
            whl.extractall(site)
        with tarfile.open(fetch("vllm", "0.16.0", "sdist")) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith("vllm-0.16.0/vllm/")]
            for m in members:
                m.name = m.name[len("vllm-0.16.0/"):]
            tar.extractall(site, members=members)
        (site / "vllm-0.16.0.dist-info").mkdir()
        (site / "vllm-0.16.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.16.0\n")
        patches = yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
        python = str(venv / "bin" / "python")

        def call(state):
            env = inspect(python, {"speculators", "vllm"}, {"speculators", "vllm"}, runner)
            return run(patches, env, SourceTree(env.roots), state)

        t0 = time.perf_counter()
        unpatched = compat.check_package(SourceTree([str(site)]), str(site / "speculators"), "vllm")
        t_compat = time.perf_counter() - t0
        call("present")
        t0 = time.perf_counter()
        out = call("asserted")
        t_assert = time.perf_counter() - t0
        assert "failed" not in out, out.get("msg")
        print("source_patch state=asserted, speculators 0.3.0 set (10 patches) vs vLLM 0.16.0: %.2f s (target < 1 s)"
              % t_assert)
        print("static compatibility check, unpatched speculators 0.3.0 vs vLLM 0.16.0: %.2f s (target < 5 s; "
              "replaces ~18 min model load per discovered error) -> %s" % (t_compat, compat.summary(unpatched)))
        print("cpus: %s" % os.cpu_count())


if __name__ == "__main__":
    main()
