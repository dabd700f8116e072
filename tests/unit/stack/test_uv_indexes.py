"""Where uv takes packages from, and what a user reads when it cannot resolve, through the real ml_venv role.

The role installs the pinned uv (pip with --require-hashes) under tmp_path and reads the host's pip settings, here
a pip configuration file named by PIP_CONFIG_FILE: a partial mirror (an index holding only a too-new version of a
package) ahead of a full index, as the machines this project is tested on are set up. Each install goes through
the collection's uv_pip module with the role's environment, as the stack's roles install.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from playbook_json import run_tasks  # noqa: E402 - tests/unit is not a package
from tinywheel import file_index  # noqa: E402 - tests/unit/stack is not a package

PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
PKG = "specdec-probe-pkg"  # a name no public index carries
NOTE = "Say that uv resolves across the indexes pip's settings name, as pip does"
INSTALL = "Install the probe package"


@pytest.fixture()
def mirrors(tmp_path, monkeypatch):
    """pip's settings name a partial mirror (PKG 2.0 only) and a full index (PKG 1.0 and 2.0) as extra indexes."""
    partial = file_index(tmp_path / "partial", PKG, ["2.0"])
    full = file_index(tmp_path / "full", PKG, ["1.0", "2.0"])
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nextra-index-url = {partial} {full}\n")
    for name in [n for n in list(__import__("os").environ) if n.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    return partial, full


def install(tmp_path, requirement, *args):
    """The role's main tasks, then the uv_pip module installing REQUIREMENT; returns {task name: result}."""
    prefix = tmp_path / "prefix"
    rc, results = run_tasks(tmp_path, [
        {"name": "Create the venv", "ansible.builtin.include_role": {"name": "specdec.eagle3.ml_venv"}},
        {"name": INSTALL, "specdec.eagle3.uv_pip": {
            "uv": "{{ ml_venv_uv_bin }}", "python": "{{ ml_venv_python_bin }}",
            "args": "{{ ml_venv_source_args + ['" + requirement + "'] }}"},
         "environment": "{{ ml_venv_install_env }}", "ignore_errors": True},
        {"name": "Show the install environment", "ansible.builtin.debug": {"var": "ml_venv_install_env"}},
    ], *args, play_vars={
        "specdec_prefix": str(prefix), "specdec_venv_path": str(prefix / "venv"), "specdec_python_version": PYVER,
        "specdec_extra_ca_bundle": "", "ml_venv_python": sys.executable, "ml_venv_seed": False})
    assert rc == 0, results
    return results


def venv_value(tmp_path):
    python = tmp_path / "prefix" / "venv" / "bin" / "python"
    return subprocess.run([str(python), "-c", "import specdec_probe_pkg as p; print(p.VALUE)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_pip_settings_with_a_partial_mirror_resolve_as_pip_does(tmp_path, mirrors):
    results = install(tmp_path, f"{PKG}<2")
    assert results[INSTALL].get("failed") is not True, results[INSTALL].get("msg")
    assert results[INSTALL]["changed"] is True
    assert venv_value(tmp_path) == "1.0"
    assert results["Show the install environment"]["ml_venv_install_env"]["UV_INDEX_STRATEGY"] == "unsafe-best-match"
    partial, full = mirrors
    assert results[NOTE]["msg"] == (
        f"uv takes the best version across the indexes pip's settings name (https://pypi.org/simple, {partial}, {full}), "
        "as pip does on this host; set ml_venv_index_strategy to first-index to take each package only from the first "
        "index that lists it.")
    # The same requirement again: nothing to do, no change.
    again = install(tmp_path, f"{PKG}<2")
    assert again[INSTALL]["changed"] is False


def test_first_index_stops_at_the_partial_mirror_in_one_line(tmp_path, mirrors):
    partial, full = mirrors
    results = install(tmp_path, f"{PKG}<2", "-e", "ml_venv_index_strategy=first-index")
    res = results[INSTALL]
    assert res["failed"] is True
    assert "\n" not in res["msg"]
    venv = tmp_path / "prefix" / "venv"
    assert res["msg"] == (
        f"uv found no version of {PKG} that satisfies {PKG}<2 for {venv}: {partial} lists {PKG} but not at that "
        f"version, and with the first-index strategy uv asks no later index (only {PKG}==2.0 is available and you "
        f"require {PKG}<2). Sources: indexes {partial}, {full}, https://pypi.org/simple (first-index). If every index "
        f"is trusted, set ml_venv_index_strategy: unsafe-best-match (pip's behaviour); otherwise put a wheel of {PKG} "
        f"matching {PKG}<2 in a find-links folder (ml_venv_find_links) or take {partial} out of pip's extra-index-url.")
    assert NOTE not in results or results[NOTE].get("skipped") is True


def test_a_version_no_index_has_is_one_line(tmp_path, mirrors):
    results = install(tmp_path, f"{PKG}==9.9")
    res = results[INSTALL]
    assert res["failed"] is True and "\n" not in res["msg"]
    assert re.fullmatch(
        rf"uv found no set of versions to install into {re.escape(str(tmp_path / 'prefix' / 'venv'))}: there is no "
        rf"version of {PKG}==9\.9 and you require {PKG}==9\.9\. Sources: indexes .* \(unsafe-best-match\)\. None of them "
        r"has a matching version: correct the pinned version or requirement, or put a matching wheel in a find-links "
        r"folder \(ml_venv_find_links\)\.", res["msg"]), res["msg"]
    # uv's own words stay in the result for -v.
    assert "No solution found" in res["stderr"]


def test_the_environment_does_not_choose_the_index_strategy(tmp_path, mirrors, monkeypatch):
    """Root's UV_INDEX_STRATEGY no longer decides: one index in pip's settings keeps uv's first-index default."""
    (tmp_path / "pip.conf").write_text("[global]\n")
    monkeypatch.setenv("UV_INDEX_STRATEGY", "unsafe-best-match")
    results = install(tmp_path, f"{PKG}<2")
    assert results["Show the install environment"]["ml_venv_install_env"]["UV_INDEX_STRATEGY"] == "first-index"
    assert results[NOTE].get("skipped") is True
