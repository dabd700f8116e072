"""Static speculators <-> vLLM check on real releases: the engine per pair, the module through Ansible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import sp_helpers

from ansible_collections.specdec.eagle3.plugins.module_utils import compat
from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree

ROOT = Path(__file__).resolve().parents[3]
CASES = yaml.safe_load((Path(__file__).parent / "cases.yml").read_text())["pairs"]


def _venv(case, make_venv, swap_vllm):
    python, site = make_venv(case["speculators"], case.get("patched_on") or case["vllm"])
    if case.get("patched_on"):
        out = sp_helpers.apply(python, sp_helpers.load_set("speculators_0_3_0")["patches"])
        assert "failed" not in out, out.get("msg")
        assert any(r["state"] == "applied" for r in out["results"])
        if case["vllm"] != case["patched_on"]:
            swap_vllm(site, case["vllm"])
    return python, site


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_pair(case, make_venv, swap_vllm):
    _unused, site = _venv(case, make_venv, swap_vllm)
    before = sp_helpers.snapshot(site)
    findings = compat.check_package(SourceTree([str(site)]), str(site / "speculators"), "vllm")
    assert sp_helpers.snapshot(site) == before  # reads only
    assert len([f for f in findings if f.state == "ok"]) >= 30  # the scan really saw speculators' vLLM imports
    broken = ["%s | %s" % (f.symbol, f.why) for f in findings if f.state == "broken"]
    for expected in case["broken"]:
        assert any(expected.split(" | ")[0] in b and expected.split(" | ")[1] in b for b in broken), (expected, broken)
    if not case["broken"]:
        assert broken == []
        assert compat.summary(findings).startswith("clean: ")
    else:
        assert compat.summary(findings).startswith("%d broken" % len(broken))


def test_subpaths_limit_the_scan(make_venv):
    _unused, site = make_venv("0.3.0", "0.16.0")
    tree = SourceTree([str(site)])
    only = compat.check_package(tree, str(site / "speculators"), "vllm", ["data_generation/custom_worker.py"])
    assert only and {f.site.split(":")[0] for f in only} == {"speculators/data_generation/custom_worker.py"}
    assert all(f.state != "broken" for f in only)


def _module(python, args="", extra=""):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m",
           "specdec.eagle3.vllm_compat", "-a", "python=%s %s" % (python, args)] + extra.split()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), check=False)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_fails_on_breaks_reports_when_told_and_writes_nothing(make_venv):
    python, site = make_venv("0.3.0", "0.16.0")
    before = sp_helpers.snapshot(site)
    failed = _module(python, extra="--check")
    assert failed["failed"] is True and failed["changed"] is False
    assert "speculators 0.3.0 vs vllm 0.16.0: 3 broken" in failed["msg"]
    assert "specdec.eagle3.source_patches" in failed["msg"]
    sites = {r["site"] for r in failed["broken"]}
    assert "speculators/data_generation/vllm_hidden_states_generator.py:194" in sites
    report = _module(python, "report_only=true paths=data_generation")
    assert not report.get("failed") and report["changed"] is False
    assert report["summary"] == failed["summary"]  # all three breaks are in data_generation
    assert report["versions"] == {"speculators": "0.3.0", "vllm": "0.16.0"}
    assert sp_helpers.snapshot(site) == before


def test_module_clean_pair_passes(make_venv):
    python, _unused = make_venv("0.4.0.1", "0.16.0")
    out = _module(python)
    assert not out.get("failed"), out.get("msg")
    assert out["broken"] == [] and out["summary"].startswith("speculators 0.4.0.1 vs vllm 0.16.0: clean: ")


@pytest.mark.parametrize("spec, args, expected", [
    (None, "", "distribution 'speculators' is not installed in the environment of"),
    ("0.3.0", "paths=nonexistent", "paths: 'nonexistent' is not in speculators 0.3.0"),
], ids=["missing-distribution", "bad-path"])
def test_module_bad_input_is_one_clear_message(make_venv, spec, args, expected):
    python, _unused = make_venv(spec, "0.16.0")
    out = _module(python, args)
    assert out["failed"] is True and expected in out["msg"]


def test_module_wrong_interpreter(tmp_path):
    out = _module(str(tmp_path / "nope" / "python"))
    assert out["failed"] is True and "does not exist: create the venv first" in out["msg"]
