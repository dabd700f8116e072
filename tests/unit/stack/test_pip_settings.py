"""uv gets the host's pip settings (roles/ml_venv/files/pip_settings.py), as pip itself would use them.

Runs the script with this interpreter's real pip; a pip configuration file named by PIP_CONFIG_FILE and PIP_*
variables stand for the user's environment.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "ml_venv" / "files" / "pip_settings.py"


def settings(tmp_path, conf, **env):
    (tmp_path / "pip.conf").write_text(conf)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    clean.update(PIP_CONFIG_FILE=str(tmp_path / "pip.conf"), **env)
    out = subprocess.run([sys.executable, str(SCRIPT)], env=clean, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_find_links_indexes_and_constraints_reach_uv(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (tmp_path / "c.txt").write_text("torch<=2.14.1\n")
    got = settings(tmp_path, f"[global]\nextra-index-url = file://{tmp_path}/missing-index https://mirror.example/simple\n"
                             f"constraint = {tmp_path}/c.txt\n", PIP_FIND_LINKS=str(wheels))
    assert got["args"] == ["--find-links", str(wheels), "--extra-index-url", "https://mirror.example/simple",
                           "--constraint", f"{tmp_path}/c.txt"]
    assert got["dropped"] == [f"file://{tmp_path}/missing-index"]
    # The indexes pip itself consults: PyPI (no index-url set) and the extra index that exists.
    assert got["indexes"] == ["https://pypi.org/simple", "https://mirror.example/simple"]


def test_the_environment_variable_wins_over_the_file(tmp_path):
    got = settings(tmp_path, "[global]\nindex-url = https://a.example/simple\n", PIP_INDEX_URL="https://b.example/simple")
    assert got["args"][:2] == ["--index-url", "https://b.example/simple"]
    assert got["indexes"] == ["https://b.example/simple"]


def test_no_index_consults_no_index(tmp_path):
    got = settings(tmp_path, "[global]\nextra-index-url = https://a.example/simple\nno-index = true\n")
    assert got["indexes"] == [] and "--no-index" in got["args"]


def test_no_settings_no_arguments(tmp_path):
    got = settings(tmp_path, "")
    assert [a for a in got["args"] if a != "--constraint" and not a.startswith("/etc/")] == []
