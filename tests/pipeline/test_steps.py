"""Each step on the tiny target, manifests, skip-on-rerun and downstream re-runs after a config change."""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import DATASET, pipeline, write_config

from specdec_pipeline import STEPS, manifest, tracks
from specdec_pipeline.errors import PipelineError


def load_manifests(run_dir):
    return {s: json.loads((run_dir / "manifests" / f"{s}.json").read_text()) for s in STEPS}


def test_full_run_writes_every_step_and_its_manifest(full_run):
    summary, run_dir = full_run["summary"], full_run["run_dir"]
    assert summary["ran"] == list(STEPS) and summary["stopped"] == ""
    mans = load_manifests(run_dir)
    assert mans["prepare"]["counts"]["samples"] == 24
    assert mans["extract"]["counts"]["samples"] == 24
    assert mans["extract"]["counts"]["layer_ids"] == [2, 4, 5, 7]  # [2, L//2, L-3, L-1] for 8 layers
    assert mans["vocab"]["counts"]["target_vocab_size"] == 512
    assert 0.5 < mans["vocab"]["counts"]["coverage"] <= 1.0
    assert mans["train"]["counts"]["device"] == "cpu" and mans["train"]["counts"]["steps"] > 0
    for step, man in mans.items():
        assert man["versions"]["speculators"] == "0.3.0"
        for rel, meta in man["outputs"].items():
            assert (run_dir / rel).stat().st_size == meta["size"], (step, rel)
    # every output digest recorded is the file's real sha256
    from specdec_pipeline.fsutil import sha256_file
    rel, meta = next(iter(mans["vocab"]["outputs"].items()))
    assert sha256_file(run_dir / rel) == meta["sha256"]
    # the draft vocab step's own accounting: t2d marks exactly draft_vocab_size tokens, d2t maps back onto them
    d2t, t2d = np.load(run_dir / "vocab" / "d2t.npy"), np.load(run_dir / "vocab" / "t2d.npy")
    assert t2d.sum() == 128 and d2t.shape == (128,)
    assert np.all(t2d[np.arange(128) + d2t])
    report = (run_dir / "report" / "report.md").read_text()
    for png in ("loss.png", "lengths.png", "step_times.png", "disk.png"):
        assert (run_dir / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in report


def test_token_frequencies_count_only_masked_tokens_inside_the_run(full_run):
    run_dir = full_run["run_dir"]
    freq = torch.load(run_dir / "prepare" / "token_freq.pt", weights_only=True)
    samples = [json.loads(x) for x in (run_dir / "prepare" / "samples.jsonl").read_text().splitlines()]
    expected = {}
    for s in samples:
        for t, m in zip(s["input_ids"], s["loss_mask"], strict=True):
            if m:
                expected[t] = expected.get(t, 0) + 1
    assert freq == expected


def test_second_run_skips_every_step(full_run):
    before = load_manifests(full_run["run_dir"])
    proc = pipeline(full_run["config"], "run")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ran"] == [] and summary["skipped"] == list(STEPS) and summary["changed"] is False
    assert load_manifests(full_run["run_dir"]) == before


def test_config_change_reruns_that_step_and_the_ones_after(full_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(full_run["run_dir"], run_dir)
    cfg = write_config(tmp_path / "run.json", run_dir, full_run["target"], vocab={"draft_vocab_size": 96})
    proc = pipeline(cfg, "run")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["skipped"] == ["regenerate", "prepare", "extract"]
    assert summary["ran"] == ["vocab", "train", "export"]
    rows = [json.loads(x) for x in (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in rows if "val" in r) == 1, "metrics of the earlier training were kept"
    from safetensors import safe_open
    with safe_open(str(run_dir / "export" / "model.safetensors"), framework="pt") as f:
        assert tuple(f.get_tensor("d2t").shape) == (96,)
        assert tuple(f.get_tensor("lm_head.weight").shape)[0] == 96


def test_changed_output_file_reruns_the_step(full_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(full_run["run_dir"], run_dir)
    cfg = tracks.load(write_config(tmp_path / "run.json", run_dir, full_run["target"]))
    assert manifest.is_current(cfg, "vocab") == (True, "")
    np.save(run_dir / "vocab" / "d2t.npy", np.zeros(128, dtype=np.int64))
    current, why = manifest.is_current(cfg, "vocab")
    assert not current and "d2t.npy" in why


def test_too_few_masked_samples_fails_with_one_clear_message(tiny_target, tmp_path):
    data = tmp_path / "users_only.jsonl"
    lines = DATASET.read_text().splitlines()
    data.write_text("\n".join(json.dumps({"conversations": [t for t in json.loads(x)["conversations"]
                                                            if t["from"] != "gpt"]}) for x in lines) + "\n")
    cfg = write_config(tmp_path / "run.json", tmp_path / "run", tiny_target, dataset={"source": str(data)})
    proc = pipeline(cfg, "run", check=False)
    assert proc.returncode == 2
    err = [x for x in proc.stderr.splitlines() if x.startswith("ERROR:")]
    assert len(err) == 1 and "0/24" in err[0] and str(data) in err[0] and "min_mask_share" in err[0]
    assert not (tmp_path / "run" / "manifests" / "prepare.json").exists()
    assert not (tmp_path / "run" / "prepare" / "samples.jsonl").exists()


def test_unknown_config_key_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"run_dir": "/x", "target": {"path": "/t"}, "dataset": {"source": "a.jsonl"},
                                "extract": {"layer_idz": [1]}}))
    with pytest.raises(PipelineError, match=r"bad.json.*extract.*unknown key 'layer_idz'"):
        tracks.load(path)
