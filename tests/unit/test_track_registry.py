"""The tracks behind one static seam: every track package declares the same API, the registry names every track,
the step table covers every step, nothing under tracks/ (or the command line) picks a module by name at run time,
loading the registry imports no track's step modules, the package has no import circle, Ansible's track choices
are the registry's and every track has its files, and a throwaway third track takes exactly what docs/tracks.md
lists (torch-free: runs in the tool venv)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

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
    # each track's package and its declarations (rules.py), nothing else
    assert json.loads(proc.stdout) == ["specdec_pipeline.tracks.current", "specdec_pipeline.tracks.current.rules",
                                       "specdec_pipeline.tracks.patched", "specdec_pipeline.tracks.patched.rules"]


# -- the import graph ---------------------------------------------------------------------------------------------
def import_graph(package_dir):
    """{module: modules of the package it imports}, from every import statement of PACKAGE_DIR's files - those
    inside functions too (they run when the function is called)."""
    root = package_dir.parent
    mods = {}
    for path in package_dir.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path

    def known(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                found |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base) for a in node.names}
        graph[mod] = found - {"", mod}
    return graph


def circles(graph):
    """The import circles of GRAPH: for each module, a shortest path of imports back to itself (deduplicated by
    the set of modules on it)."""
    found = {}
    for start in sorted(graph):
        prev, todo = {start: None}, [start]
        while todo:
            mod = todo.pop(0)
            if start in graph[mod]:
                path = [mod]
                while prev[path[0]] is not None:
                    path.insert(0, prev[path[0]])
                found.setdefault(frozenset(path), " -> ".join([*path, start]))
                break
            for nxt in sorted(graph[mod] - set(prev)):
                prev[nxt] = mod
                todo.append(nxt)
    return sorted(found.values())


def test_the_package_has_no_import_circle():
    # config.py is the shared settings every step imports; the registry and the loader (tracks/__init__) import it,
    # never the other way round - else config -> tracks -> a track's step module -> config.
    graph = import_graph(PACKAGE)
    assert "specdec_pipeline.tracks" not in graph["specdec_pipeline.config"]
    assert circles(graph) == []


# -- Ansible's tracks and Python's TRACKS -------------------------------------------------------------------------
# What a track has besides its registry line and its choice of specdec_track (docs/tracks.md, "Adding a track").
TRACK_FILES = (
    "roles/eagle3_pipeline/files/specdec_pipeline/tracks/{track}/__init__.py",
    "playbooks/tracks/{track}/preflight.yml",
    "playbooks/tracks/{track}/stack.yml",
    "playbooks/tracks/{track}/patch.yml",
    "roles/eagle3_pipeline/tasks/tracks/{track}.yml",
    "roles/eagle3_pipeline/vars/tracks/{track}.yml",
)
# The two files a new track adds a line to: the registry (its import and its TRACKS entry) and the choice.
TRACK_EDITS = ("roles/eagle3_pipeline/files/specdec_pipeline/tracks/__init__.py", "roles/specdec/meta/argument_specs.yml")


def track_choices(root):
    spec = yaml.safe_load((root / "roles" / "specdec" / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]["specdec_track"]["choices"]


def track_problems(root, names):
    """What the tree at ROOT lacks for the tracks NAMES (the registry's): the choices of specdec_track must be
    exactly NAMES, and each track needs every one of TRACK_FILES."""
    out = []
    if sorted(track_choices(root)) != sorted(names):
        out.append(f"specdec_track choices {track_choices(root)}, TRACKS {sorted(names)}")
    out += [f.format(track=t) for t in names for f in TRACK_FILES if not (root / f.format(track=t)).is_file()]
    return out


def test_ansible_track_choices_are_the_registry_and_every_track_has_its_files():
    assert track_choices(ROOT) == list(tracks.TRACKS)
    assert track_problems(ROOT, list(tracks.TRACKS)) == []


def test_the_docs_list_exactly_what_adding_a_track_takes():
    text = (ROOT / "docs" / "tracks.md").read_text()
    section = text[text.index("## Adding a track"):]
    block = section[section.index("```") + 3:]
    listed = [line.split()[0] for line in block[block.index("\n") + 1:block.index("```")].splitlines() if line.strip()]
    assert listed == [f.format(track="<name>") for f in TRACK_FILES] + list(TRACK_EDITS)


THIRD = '''"""A throwaway third track: the patched track's steps and rules under another name, one setting of its own."""

from specdec_pipeline.errors import PipelineError
from specdec_pipeline.tracks.patched import (  # noqa: F401
    DISK_FIX, STEPS, default_layer_ids, extract_bytes_per_token, layer_ids, layer_ids_problem, storage_name)

NAME = "third"
SETTINGS = {"third": {"knob": 1}}
STEP_KEYS = {"train": ["track", "third.knob"]}


def check_settings(cfg, where):
    if not isinstance(cfg["third"]["knob"], int):
        raise PipelineError(f"{where}: third.knob is {cfg['third']['knob']!r}; expected a whole number.")
'''

PROBE = """
import json, sys
from specdec_pipeline import tracks
from specdec_pipeline.errors import PipelineError
out = {"names": list(tracks.TRACKS)}
for name, path in zip(("third", "bad", "patched"), sys.argv[1:]):
    try:
        cfg = tracks.load(path)
        out[name] = {"track": tracks.of(cfg).NAME, "knob": cfg["third"]["knob"], "train": cfg["_step_keys"]["train"],
                     "lacks": [a for a in tracks.API if not hasattr(tracks.of(cfg), a)],
                     "extract": tracks.step_module(cfg, "extract").__name__}
    except PipelineError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_a_third_track_is_its_folder_its_registry_line_and_its_ansible_files(tmp_path):
    root = tmp_path / "tree"
    for part in ("roles/eagle3_pipeline/files/specdec_pipeline", "playbooks/tracks", "roles/eagle3_pipeline/tasks/tracks",
                 "roles/eagle3_pipeline/vars/tracks", "roles/specdec/meta"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    package = root / "roles/eagle3_pipeline/files/specdec_pipeline"
    base = {"run_dir": str(tmp_path / "run"), "target": {"path": "/m"}, "dataset": {"source": "d.jsonl"}}
    configs = []
    for name, over in (("third", {"track": "third", "third": {"knob": 7}}), ("bad", {"track": "third", "third": {"knob": "x"}}),
                       ("patched", {"track": "patched", "third": {"knob": 2}})):
        configs.append(tmp_path / f"{name}.json")
        configs[-1].write_text(json.dumps({**base, **over}))

    def probe():
        proc = subprocess.run([sys.executable, "-B", "-c", PROBE, *map(str, configs)], env={"PYTHONPATH": str(package.parent)},
                              text=True, capture_output=True, check=True)
        return json.loads(proc.stdout)

    # The folder alone: the registry does not find it, the loader knows neither its settings nor its name.
    (package / "tracks" / "third").mkdir()
    (package / "tracks" / "third" / "__init__.py").write_text(THIRD)
    before = probe()
    assert before["names"] == ["patched", "current"] and "unknown key 'third'" in before["third"]
    configs[0].write_text(json.dumps({**base, "track": "third"}))
    assert "track is 'third'; expected one of ['current', 'patched']" in probe()["third"]
    configs[0].write_text(json.dumps({**base, "track": "third", "third": {"knob": 7}}))

    # Its registry line (the static import and the TRACKS entry): the registry finds it, the loader takes its
    # settings, their defaults and check, and its step keys; its steps are the ones it names.
    registry = package / "tracks" / "__init__.py"
    text = registry.read_text()
    for old, new in (("from specdec_pipeline.tracks import current, patched\n",
                      "from specdec_pipeline.tracks import current, patched, third\n"),
                     ('TRACKS = {"patched": patched, "current": current}', 'TRACKS = {"patched": patched, "current": current, "third": third}')):
        assert text.count(old) == 1, f"the registry line changed: {old!r} - update docs/tracks.md and this test"
        text = text.replace(old, new)
    registry.write_text(text)
    after = probe()
    assert after["names"] == ["patched", "current", "third"]
    assert after["third"] == {"track": "third", "knob": 7, "train": [*tracks.config.STEP_KEYS["train"], "track", "third.knob"],
                              "lacks": [], "extract": "specdec_pipeline.tracks.patched.extract"}
    assert "third.knob is 'x'; expected a whole number" in after["bad"]
    assert after["patched"]["track"] == "patched" and after["patched"]["knob"] == 2  # its section on another track

    # The Ansible side: the choice and the listed files, each of them needed.
    names = after["names"]
    assert track_problems(root, names) == [f"specdec_track choices {track_choices(root)}, TRACKS {sorted(names)}",
                                           *(f.format(track="third") for f in TRACK_FILES[1:])]
    spec = root / "roles/specdec/meta/argument_specs.yml"
    spec.write_text(spec.read_text().replace("choices: [patched, current]", "choices: [patched, current, third]"))
    for listed in TRACK_FILES[1:]:
        dest = root / listed.format(track="third")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / listed.format(track="patched"), dest)
    assert track_problems(root, names) == []
    for listed in TRACK_FILES:
        path = root / listed.format(track="third")
        kept = path.read_bytes()
        path.unlink()
        assert track_problems(root, names) == [listed.format(track="third")]
        path.write_bytes(kept)
