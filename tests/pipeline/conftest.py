"""Fixtures: the tiny target and the mini-Kimi (both built locally), speculators 0.3.0 patched in throwaway trees,
run configurations and one completed pipeline run.

Run with the pipeline venv: scripts/pipeline-venv && .cache/venvs/pipeline/bin/python -m pytest tests/pipeline
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
DATASET = FILES / "tiny_conversations.jsonl"
sys.path.insert(0, str(FILES))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
from tests.support import pipeline_cli  # noqa: E402

# Keep the role's files/ free of __pycache__ (the role copies that tree to the host).
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def pipeline(*args, check=True, pythonpath=(), **kw):
    """python -m specdec_pipeline ARGS; PYTHONPATH entries after the code (e.g. a patched speculators tree) come
    before the venv's site-packages, in this process's children and theirs (the trainer)."""
    return pipeline_cli.run(*args, env=pipeline_cli.environment(after=pythonpath), check=check, **kw)


def write_config(path, run_dir, target, **over):
    cfg = {"run_dir": str(run_dir), "target": {"path": str(target)}, "dataset": {"source": str(DATASET), "max_samples": 24},
           "seq_length": 256, "vocab": {"draft_vocab_size": 128},
           "train": {"epochs": 1, "total_seq_len": 256, "lr": 1e-3}}
    for key, value in over.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    Path(path).write_text(json.dumps(cfg))
    return Path(path)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "target"
    proc = pipeline(DATASET, "build-tiny", "--out", out)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["changed"] is True
    return out


@pytest.fixture(scope="session")
def full_run(tmp_path_factory, tiny_target):
    base = tmp_path_factory.mktemp("full")
    cfg = write_config(base / "run.json", base / "run", tiny_target)
    proc = pipeline(cfg, "run")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"config": cfg, "run_dir": base / "run", "summary": summary, "target": tiny_target}


@pytest.fixture(scope="session")
def mini_kimi(tmp_path_factory):
    """The mini-Kimi built by the role's command in this venv (transformers 4.57: the DeepseekV3ForCausalLM builder),
    once per session; a second build of the same directory must be a no-op."""
    out = tmp_path_factory.mktemp("mini-kimi") / "target"
    runs = [json.loads(pipeline(DATASET, "build-tiny", "--out", out, "--shape", "kimi").stdout.strip().splitlines()[-1])
            for _attempt in range(2)]
    assert [r["changed"] for r in runs] == [True, False]
    return out


def _runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def speculators_tree(dest, prefixes):
    """The site directory of a throwaway venv in DEST holding the real speculators 0.3.0 wheel, patched by the
    collection's own patch engine with the patches of patch_sets/speculators_0_3_0.yml whose ids start with one of
    PREFIXES (none: unpatched). The venv's installed speculators is never touched."""
    sys.path[:0] = [str(p) for p in (ROOT / "collections", ROOT) if str(p) not in sys.path]
    from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: PLC0415
    from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run as patch_run  # noqa: PLC0415
    from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: PLC0415
    from tests.support.upstream import fetch  # noqa: PLC0415

    venv = Path(dest) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(fetch("speculators", "0.3.0", "wheel")) as whl:
        whl.extractall(site)
    patches = [p for p in yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
               if p["id"].startswith(tuple(prefixes))] if prefixes else []
    if patches:
        env = inspect(str(venv / "bin" / "python"), {"speculators"}, {"speculators"}, _runner)
        result = patch_run(patches, env, SourceTree(env.roots), "present")
        assert "failed" not in result, result.get("msg")
        assert sorted(r["id"] for r in result["results"] if r["state"] == "applied") == sorted(p["id"] for p in patches)
    return site


@pytest.fixture(scope="session")
def speculators_site(tmp_path_factory):
    """speculators_site(*prefixes): a speculators_tree patched with PREFIXES (e.g. "t01", "t02"), made once per
    session; speculators_site() is the unpatched wheel."""
    made = {}

    def site(*prefixes):
        key = tuple(sorted(prefixes))
        if key not in made:
            made[key] = speculators_tree(tmp_path_factory.mktemp("speculators-" + ("-".join(key) or "unpatched")), key)
        return made[key]

    return site
