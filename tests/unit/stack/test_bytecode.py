"""The ML venv's bytecode step (roles/ml_venv/files/bytecode.py): compiles what is missing or out of date, once.

Runs the script the way the role does (`python -I -c <its text> [--check] DIR`) on a small tree of sources; the
.pyc files it writes are then checked by the import system itself: a process that cannot write bytecode imports the
module from the .pyc (what the pipeline user meets in root's venv).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = (Path(__file__).resolve().parents[3] / "roles" / "ml_venv" / "files" / "bytecode.py").read_text()


def run(tree, check=False):
    argv = [sys.executable, "-I", "-c", SCRIPT] + (["--check"] if check else []) + [str(tree)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert proc.stderr == ""
    return json.loads(proc.stdout)


def pyc(path):
    return Path(importlib.util.cache_from_source(str(path)))


def make_tree(tmp_path):
    pkg = tmp_path / "site" / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (pkg / "py2_only.py").write_text('print "written for Python 2"\n')
    return tmp_path / "site"


def test_compiles_what_is_missing_once_and_check_mode_writes_nothing(tmp_path):
    site = make_tree(tmp_path)
    assert run(site, check=True) == {"files": 3, "out_of_date": 3, "compiled": 2, "failed": 1, "check": True}
    assert not list(site.rglob("*.pyc")), "check mode wrote bytecode"
    assert run(site) == {"files": 3, "out_of_date": 3, "compiled": 2, "failed": 1, "check": False}
    assert pyc(site / "pkg" / "__init__.py").is_file() and pyc(site / "pkg" / "sub" / "mod.py").is_file()
    # A source that does not compile stays out of date but is no change: the second run reports nothing compiled.
    assert run(site)["compiled"] == 0 and run(site, check=True)["compiled"] == 0


def test_a_changed_source_is_compiled_again(tmp_path):
    site = make_tree(tmp_path)
    run(site)
    mod = site / "pkg" / "sub" / "mod.py"
    mod.write_text("def f():\n    return 3  # patched\n")
    os.utime(mod, (1_700_000_000, 1_700_000_000))  # a time the old .pyc does not carry
    assert run(site, check=True)["compiled"] == 1
    assert run(site)["compiled"] == 1 and run(site)["compiled"] == 0


def test_the_import_system_takes_the_written_bytecode(tmp_path):
    site = make_tree(tmp_path)
    run(site)
    # -B: the importing process writes no bytecode of its own; -v: the import system says which .pyc it accepted.
    proc = subprocess.run([sys.executable, "-B", "-v", "-c", "import pkg.sub.mod"], cwd=site, capture_output=True,
                          text=True, check=True)
    assert f"{pyc(site / 'pkg' / 'sub' / 'mod.py')} matches {site / 'pkg' / 'sub' / 'mod.py'}" in proc.stderr, \
        proc.stderr[-2000:]
