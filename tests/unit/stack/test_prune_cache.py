"""The ml_venv role's prune_cache entry point, run through the real role with ansible-playbook.

The role's own main tasks install the pinned uv (pip with --require-hashes, from the package index or pip's cache)
into a prefix under tmp_path and create the venv; uv then installs a small wheel built here, so the cache holds an
entry that an install refers to. An entry nothing refers to (what a --reinstall-package leaves behind) is planted
beside it. Pruning must remove that one only, report a change only when it removed something, and remove nothing in
check mode.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from playbook_json import run_tasks  # noqa: E402 - tests/unit is not a package
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tinywheel import wheel  # noqa: E402 - tests/unit/stack is not a package
PRUNE = "Remove the uv cache's entries that no install refers to"
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"


def play(tmp_path: Path, tasks: list, *args: str) -> dict:
    """Run TASKS on localhost with the role's variables pointed under tmp_path; return {task name: result}."""
    prefix = tmp_path / "prefix"
    rc, results = run_tasks(tmp_path, tasks, *args, play_vars={
        "specdec_prefix": str(prefix), "specdec_venv_path": str(prefix / "venv"), "specdec_python_version": PYVER,
        "specdec_extra_ca_bundle": "", "ml_venv_python": sys.executable, "ml_venv_seed": False})
    assert rc == 0, results
    return results


def prune(tmp_path: Path, *args: str) -> dict:
    return play(tmp_path, [{"name": "Prune", "ansible.builtin.include_role": {
        "name": "specdec.eagle3.ml_venv", "tasks_from": "prune_cache"}}], *args)[PRUNE]


def test_prune_removes_only_what_no_install_refers_to(tmp_path):
    whl = wheel(tmp_path)
    play(tmp_path, [
        {"name": "Create the venv", "ansible.builtin.include_role": {"name": "specdec.eagle3.ml_venv"}},
        {"name": "Install a wheel", "ansible.builtin.command": {
            "argv": "{{ [ml_venv_uv_bin, 'pip', 'install', '--python', ml_venv_python_bin, '" + str(whl) + "'] }}"},
         "environment": "{{ ml_venv_install_env }}"},
    ])
    archive = tmp_path / "prefix" / "cache" / "uv" / "archive-v0"
    kept = sorted(p.name for p in archive.iterdir())
    assert len(kept) == 1, kept  # the installed wheel's unpacked copy

    orphan = archive / "orphan0123456789"
    (orphan / "tinypkg").mkdir(parents=True)
    (orphan / "tinypkg" / "__init__.py").write_text("VALUE = 0\n")

    # Check mode removes nothing and reports no change.
    result = prune(tmp_path, "--check")
    assert result.get("skipped") is True and orphan.is_dir()

    result = prune(tmp_path)
    assert result["changed"] is True and result["rc"] == 0, result
    assert sorted(p.name for p in archive.iterdir()) == kept, "prune removed the wrong entries"
    # The venv still imports the installed package (its files were copied out of the cache, not linked).
    venv_python = tmp_path / "prefix" / "venv" / "bin" / "python"
    assert subprocess.run([str(venv_python), "-c", "import tinypkg; assert tinypkg.VALUE == '1.0'"], check=False).returncode == 0

    # Nothing left to remove: no change.
    result = prune(tmp_path)
    assert result["changed"] is False and result["rc"] == 0, result

    # Switched off: not run at all.
    orphan.mkdir()
    result = prune(tmp_path, "-e", "ml_venv_prune_cache=false")
    assert result.get("skipped") is True and orphan.is_dir()
