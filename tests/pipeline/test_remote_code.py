"""trust_remote_code on the patched track: the switch really switches, the files that run are named and recorded.

The target is the tiny one plus code of its own, named by auto_map the way Kimi-K2.5's is: a config class, a model
class and a tokenizer class, each in its own *.py file, and a helper they import relatively. Every one of them
appends a line to a marker file when it runs (with the offline setting it ran under), so the tests see exactly
which files transformers executed. unused.py lies beside them and is named by nothing: it never runs and is not
listed. The switch-off run trains on the real speculators 0.3.0 wheel patched by the collection's own patch set
(t01-t03, in a throwaway tree placed in front of the venv's copy), so the patched verifier-config load (t01) is
covered too.

Run with the pipeline venv: .cache/venvs/pipeline/bin/python -m pytest tests/pipeline/test_remote_code.py
"""

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml
from conftest import DATASET, ROOT, write_config

sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run as patch_run  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: E402
from tests.support import pipeline_cli  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402

RUNS = {"configuration_specdec_tiny.py", "modeling_specdec_tiny.py", "tokenization_specdec_tiny.py"}
LISTED = RUNS | {"specdec_marker.py"}
MARKER_HELPER = '''import json
import os

import huggingface_hub.constants


def note(path):
    with open({marker!r}, "a") as out:
        out.write(json.dumps({{"file": os.path.basename(path), "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
                              "hub_offline": huggingface_hub.constants.HF_HUB_OFFLINE}}) + "\\n")
'''
MODULES = {
    "configuration_specdec_tiny.py": "from transformers import LlamaConfig\n\nfrom .specdec_marker import note\n\n"
                                     "note(__file__)\n\n\nclass SpecdecTinyConfig(LlamaConfig):\n    pass\n",
    "modeling_specdec_tiny.py": "from transformers import LlamaForCausalLM\n\n"
                                "from .configuration_specdec_tiny import SpecdecTinyConfig\n"
                                "from .specdec_marker import note\n\nnote(__file__)\n\n\n"
                                "class SpecdecTinyForCausalLM(LlamaForCausalLM):\n"
                                "    config_class = SpecdecTinyConfig\n",
    "tokenization_specdec_tiny.py": "from transformers import LlamaTokenizer\n\nfrom .specdec_marker import note\n\n"
                                    "note(__file__)\n\n\nclass SpecdecTinyTokenizer(LlamaTokenizer):\n    pass\n",
    "unused.py": "from .specdec_marker import note\n\nnote(__file__)\n",
}


def _remote_target(tiny_target, dest, auto_config="configuration_specdec_tiny.SpecdecTinyConfig"):
    shutil.copytree(tiny_target, dest)
    marker = dest.parent / f"{dest.name}.ran.jsonl"
    (dest / "specdec_marker.py").write_text(MARKER_HELPER.format(marker=str(marker)))
    for name, text in MODULES.items():
        (dest / name).write_text(text)
    conf = json.loads((dest / "config.json").read_text())
    conf["auto_map"] = {"AutoConfig": auto_config,
                        "AutoModelForCausalLM": "modeling_specdec_tiny.SpecdecTinyForCausalLM"}
    (dest / "config.json").write_text(json.dumps(conf, indent=2))
    tok = json.loads((dest / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["tokenization_specdec_tiny.SpecdecTinyTokenizer", None]}
    (dest / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    return dest, marker


def _ran(marker):
    return [json.loads(line) for line in marker.read_text().splitlines()] if marker.exists() else []


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def patched_speculators(tmp_path_factory):
    """The real speculators 0.3.0 wheel in a throwaway tree, patched by the shipped set's training patches."""
    venv = tmp_path_factory.mktemp("spec") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(fetch("speculators", "0.3.0", "wheel")) as whl:
        whl.extractall(site)
    patches = [p for p in yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
               if p["id"].startswith("t")]

    def runner(argv):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    env = inspect(str(venv / "bin" / "python"), {"speculators"}, {"speculators"}, runner)
    result = patch_run(patches, env, SourceTree(env.roots), "present")
    assert "failed" not in result, result.get("msg")
    return site


def _pipeline(cfg, *args, hf_home, pythonpath=()):
    # HF_HUB_OFFLINE: the pipeline sets it itself
    env = pipeline_cli.environment(before=pythonpath, drop=("HF_HUB_OFFLINE", "SPECDEC_TRUST_REMOTE_CODE"),
                                   HF_HOME=hf_home)
    return pipeline_cli.run(cfg, *args, env=env, timeout=900)


def _write(base, target, trust, **over):
    cfg = write_config(base / "run.json", base / "run", target, **over)
    data = json.loads(cfg.read_text())
    data["target"]["trust_remote_code"] = trust
    data["dataset"]["max_samples"] = 8
    cfg.write_text(json.dumps(data))
    return cfg


def test_switch_off_runs_none_of_the_targets_code(tiny_target, tmp_path, patched_speculators):
    target, marker = _remote_target(tiny_target, tmp_path / "target")
    # a dataset directory goes through the hub loader (a child process of its own, the only one not offline)
    data_dir = tmp_path / "conversations"
    data_dir.mkdir()
    shutil.copy(DATASET, data_dir / "train.jsonl")
    cfg = _write(tmp_path, target, False, dataset={"source": str(data_dir)})
    proc = _pipeline(cfg, "run", "--until", "train", hf_home=tmp_path / "hf", pythonpath=[patched_speculators])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _ran(marker) == []  # prepare, extract and the patched speculators (t01) in train ran none of it
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ran"] == ["regenerate", "prepare", "extract", "vocab", "train"]
    assert "trust_remote_code is off - 4 file(s) that auto_map names" in proc.stderr
    assert "runs (trust_remote_code on)" not in proc.stderr
    for step in ("prepare", "extract"):
        man = json.loads((tmp_path / "run" / "manifests" / f"{step}.json").read_text())
        assert man["remote_code"] == {"trust_remote_code": False, "files": {}}


def test_switch_on_names_records_and_notices_a_changed_file(tiny_target, tmp_path):
    target, marker = _remote_target(tiny_target, tmp_path / "target")
    cfg = _write(tmp_path, target, True)
    hf_home = tmp_path / "hf"
    proc = _pipeline(cfg, "run", "--until", "extract", hf_home=hf_home)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ran = _ran(marker)
    assert {r["file"] for r in ran} == RUNS  # unused.py never runs
    # every load of the target happened offline (the pipeline process sets HF_HUB_OFFLINE=1 before any import)
    assert all(r["HF_HUB_OFFLINE"] == "1" and r["hub_offline"] is True for r in ran), ran
    expected = {name: _sha(target / name) for name in sorted(LISTED)}
    for name, digest in expected.items():  # printed once per run, with the sha256
        assert proc.stderr.count(f"remote code: {target}/{name} runs (trust_remote_code on), sha256 {digest}") == 1
    assert "unused.py" not in proc.stderr
    manifests = tmp_path / "run" / "manifests"
    for step in ("prepare", "extract"):
        assert json.loads((manifests / f"{step}.json").read_text())["remote_code"] == \
            {"trust_remote_code": True, "files": expected}

    # a manifest written before manifests recorded the code is kept (nothing re-runs) and gets the record
    for step in ("prepare", "extract"):
        man = json.loads((manifests / f"{step}.json").read_text())
        del man["remote_code"]
        (manifests / f"{step}.json").write_text(json.dumps(man))
    proc = _pipeline(cfg, "run", "--until", "extract", hf_home=hf_home)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["skipped"] == ["regenerate", "prepare", "extract"]
    for step in ("prepare", "extract"):
        assert json.loads((manifests / f"{step}.json").read_text())["remote_code"]["files"] == expected

    # a changed file is noticed and said: the steps that ran the code run again
    conf_py = target / "configuration_specdec_tiny.py"
    conf_py.write_text(conf_py.read_text() + "# changed\n")
    proc = _pipeline(cfg, "run", "--until", "extract", hf_home=hf_home)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ran"] == ["prepare", "extract"]
    said = (f"prepare: running (the target's own code: configuration_specdec_tiny.py changed (sha256 "
            f"{expected['configuration_specdec_tiny.py'][:12]} -> {_sha(conf_py)[:12]}))")
    assert said in proc.stderr, proc.stderr[-3000:]
    assert json.loads((manifests / "extract.json").read_text())["remote_code"]["files"][conf_py.name] == _sha(conf_py)


def test_code_of_another_repository_is_refused_before_anything_runs(tiny_target, tmp_path):
    target, marker = _remote_target(tiny_target, tmp_path / "target",
                                    auto_config="someone/elsewhere--configuration_specdec_tiny.SpecdecTinyConfig")
    cfg = _write(tmp_path, target, True)
    proc = _pipeline(cfg, "run", "--until", "prepare", hf_home=tmp_path / "hf")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"ERROR: {target}/config.json: auto_map AutoConfig is "
                         "'someone/elsewhere--configuration_specdec_tiny.SpecdecTinyConfig', code of another "
                         f"repository (someone/elsewhere) that is not in {target}; expected module.Class of a file in "
                         "the target directory. Copy that code into the directory and name it there, or set "
                         "eagle3_pipeline_trust_remote_code: false.")
    assert "Traceback" not in proc.stderr
    assert _ran(marker) == [] and not (tmp_path / "run" / "manifests").exists()


def test_switch_off_names_the_setting_when_the_target_needs_its_code(tiny_target, tmp_path):
    target, marker = _remote_target(tiny_target, tmp_path / "target")
    conf = json.loads((target / "config.json").read_text())
    conf["model_type"] = "specdec_tiny"  # a type transformers does not ship: only the target's own code reads it
    (target / "config.json").write_text(json.dumps(conf))
    cfg = _write(tmp_path, target, False)
    proc = _pipeline(cfg, "run", "--until", "extract", hf_home=tmp_path / "hf")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ERROR: {target}: cannot ") and "Traceback" not in proc.stderr
    assert last.endswith("the target names its own code (configuration_specdec_tiny.py, modeling_specdec_tiny.py, "
                         "specdec_marker.py, tokenization_specdec_tiny.py) and eagle3_pipeline_trust_remote_code "
                         "is false - set it to true only if you trust that code."), last
    assert _ran(marker) == []
