"""prepare holds evaluation conversations out of training, records them, and never trains on them.

Needs the pipeline venv (transformers 4.57, speculators 0.3.0):
    .cache/venvs/pipeline/bin/python -m pytest -q tests/evaluate/test_heldout.py
"""

import json
import sys

import pytest
from conftest import FILES, ROOT

if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
from tests.support import pipeline_cli  # noqa: E402

pytest.importorskip("speculators", reason="run with the pipeline venv (scripts/pipeline-venv)")

DATASET = FILES / "tiny_conversations.jsonl"


def pipeline(*args, check=True):
    return pipeline_cli.run(*args, check=check, tail=3000)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("heldout")
    pipeline(DATASET, "build-tiny", "--out", base / "target")
    cfg = base / "run.json"
    cfg.write_text(json.dumps({"run_dir": str(base / "run"), "target": {"path": str(base / "target")},
                               "dataset": {"source": str(DATASET), "heldout": 8, "max_samples": 30},
                               "seq_length": 256}))
    pipeline(cfg, "run", "--until", "prepare")
    return base / "run", cfg


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_heldout_never_overlaps_training(prepared):
    run_dir, _cfg = prepared
    samples = _lines(run_dir / "prepare" / "samples.jsonl")
    heldout = _lines(run_dir / "prepare" / "heldout.jsonl")
    manifest = json.loads((run_dir / "manifests" / "prepare.json").read_text())
    held_idx = {r["source_index"] for r in heldout}
    assert len(held_idx) == 8 == manifest["counts"]["heldout"]
    assert sorted(held_idx) == manifest["heldout"]["source_indices"]
    assert len(samples) == 30, "max_samples applies to the training side only"
    assert held_idx.isdisjoint(s["source_index"] for s in samples)
    # no training sample contains a held-out prompt's token sequence (the rendered first user turn)
    for r in heldout:
        ids = r["prompt_ids"]
        for s in samples:
            seq = s["input_ids"]
            assert not any(seq[i:i + len(ids)] == ids for i in range(len(seq) - len(ids) + 1)), \
                f"held-out conversation {r['source_index']} appears in training sample {s['id']}"
    convs = [json.loads(x) for x in DATASET.read_text().splitlines() if x.strip()]
    for r in heldout:
        user = [m for m in r["messages"] if m["role"] == "user"]
        assert user and user[-1]["content"] in json.dumps(convs[r["source_index"]])
        assert r["reference"]


def test_heldout_is_part_of_the_prepare_hash(prepared):
    _run_dir, cfg = prepared
    status = json.loads(pipeline(cfg, "status").stdout.strip().splitlines()[-1])
    assert status["prepare"] is True
    raw = json.loads(cfg.read_text())
    raw["dataset"]["heldout"] = 4
    cfg.write_text(json.dumps(raw))
    status = json.loads(pipeline(cfg, "status").stdout.strip().splitlines()[-1])
    assert status["prepare"] is False, "changing the held-out count must re-run prepare"


def test_bad_heldout_is_one_clear_line(tmp_path, prepared):
    run_dir, dummy = prepared
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"run_dir": str(tmp_path / "r"), "target": {"path": str(run_dir.parent / "target")},
                               "dataset": {"source": str(DATASET), "heldout": 48}}))
    proc = pipeline(cfg, "run", "--until", "prepare", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ERROR: prepare: dataset.heldout is 48 but")
    assert "Traceback" not in proc.stderr
