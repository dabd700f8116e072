"""The tracks behind one static seam: every track package declares the same API, the registry names every track,
the step table covers every step, nothing under tracks/ (or the command line) picks a module by name at run time,
and loading the registry imports no track's step modules (torch-free: runs in the tool venv)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
PACKAGE = FILES / "specdec_pipeline"
sys.path.insert(0, str(FILES))
sys.dont_write_bytecode = True  # the role copies files/ to the host: no __pycache__ there

from specdec_pipeline import STEPS, tracks  # noqa: E402


def test_the_registry_maps_every_track_package_and_only_those():
    folders = sorted(p.name for p in (PACKAGE / "tracks").iterdir() if (p / "__init__.py").is_file())
    assert sorted(tracks.TRACKS) == folders
    for name, module in tracks.TRACKS.items():
        assert module.__name__ == f"specdec_pipeline.tracks.{name}" and module.NAME == name
    assert tracks.DEFAULT in tracks.TRACKS


def test_every_track_exposes_the_same_step_api():
    for name, module in tracks.TRACKS.items():
        missing = [attr for attr in tracks.API if not hasattr(module, attr)]
        assert not missing, f"tracks/{name}: lacks {missing}"
        assert tuple(module.STEPS) == STEPS, f"tracks/{name}: STEPS lists {tuple(module.STEPS)}, expected {STEPS}"
        assert all(callable(get) for get in module.STEPS.values())
        assert set(module.STEP_KEYS) <= set(STEPS)


def test_each_track_states_its_layer_id_rule_and_disk_estimate():
    patched, current = tracks.TRACKS["patched"], tracks.TRACKS["current"]
    # 61 decoder layers (Kimi-K2.5): the patched track captures layer outputs 0..60, the current one vLLM ids 0..61
    assert patched.default_layer_ids(61) == [2, 30, 58, 60] and not patched.layer_ids_problem([2, 30, 58, 60], 61)
    assert patched.layer_ids_problem([2, 30, 58, 61], 61) and patched.layer_ids_problem([5], 61)
    assert current.default_layer_ids(61) == [2, 30, 58, 61] and not current.layer_ids_problem([2, 30, 58, 61], 61)
    assert current.layer_ids_problem([2, 30, 58, 60], 61)  # does not end with the final layer
    bf16 = {"extract": {"dtype": "bfloat16"}, "current": {"hs_storage": "bf16"}}
    fp8 = {"extract": {"dtype": "bfloat16"}, "current": {"hs_storage": "fp8"}}
    assert patched.extract_bytes_per_token(bf16, 4, 7168) == 4 * 7168 * 2
    assert current.extract_bytes_per_token(bf16, 4, 7168) == 4 * 7168 * 2 + 8
    assert current.extract_bytes_per_token(fp8, 4, 7168) == 4 * 7168 + 4 + 8  # about half of bf16


def _picks_module_by_name(path):
    """True when PATH imports a module whose name it computes (importlib.import_module, __import__)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib" and any(
                a.name in ("import_module", "__import__") for a in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "import_module":
            return True
        if isinstance(node, ast.Name) and node.id == "__import__":
            return True
    return False


def test_no_module_is_chosen_by_name():
    files = [*sorted((PACKAGE / "tracks").rglob("*.py")), PACKAGE / "cli.py", PACKAGE / "steps.py"]
    dynamic = [str(p.relative_to(PACKAGE)) for p in files if p.is_file() and _picks_module_by_name(p)]
    assert not dynamic, f"importlib or __import__ in {dynamic}: the registry is static (tracks/__init__.py)"


def test_loading_the_registry_and_the_command_line_imports_no_step_module():
    code = ("import json, sys; import specdec_pipeline.cli, specdec_pipeline.tracks;"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('specdec_pipeline.tracks.'))))")
    proc = subprocess.run([sys.executable, "-B", "-c", code], env={"PYTHONPATH": str(FILES)}, text=True,
                          capture_output=True, check=True)
    assert json.loads(proc.stdout) == ["specdec_pipeline.tracks.current", "specdec_pipeline.tracks.patched"]
