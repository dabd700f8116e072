"""extract: SIGKILL at a random sample then resume; per-sample validation; disk preflight; speculators' loader;
the exported vLLM layer ids select the tensors the data was built from."""

import json
import os
import random
import signal
import subprocess
import time

import pytest
import torch
from conftest import pipeline_cli, write_config

from specdec_pipeline import disk, tracks
from specdec_pipeline.tracks.patched.backends.vllm_backend import check_plan, pack
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.ledger import read as read_finished
from specdec_pipeline.tracks.patched import rules
from specdec_pipeline.tracks.patched.extract import validate_sample


def _lines(path):
    return path.read_text().count("\n") if path.exists() else 0


def test_sigkill_during_extract_then_resume(tiny_target, tmp_path):
    cfg = write_config(tmp_path / "run.json", tmp_path / "run", tiny_target)
    env = pipeline_cli.environment()
    finished = tmp_path / "run" / "extract" / "finished.jsonl"
    kill_at = random.Random().randint(1, 20)
    proc = subprocess.Popen(pipeline_cli.command(cfg, "run", "--until", "extract"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _lines(finished) < kill_at and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before sample {kill_at}"
    before = read_finished(finished)
    assert 0 < len(before) < 24
    stats = {i: os.stat(tmp_path / "run" / "extract" / f"data_{i}.pt") for i in before}

    res = pipeline_cli.run(cfg, "run", "--until", "extract", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    ids = [json.loads(x)["id"] for x in finished.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 24, "a sample is missing or finished twice"
    for i, st in stats.items():  # samples finished before the kill were skipped, not redone
        now = os.stat(tmp_path / "run" / "extract" / f"data_{i}.pt")
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    samples = [json.loads(x) for x in (tmp_path / "run" / "prepare" / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        validate_sample(tmp_path / "run" / "extract" / f"data_{s['id']}.pt", s["input_ids"], s["loss_mask"],
                        4, 64, torch.bfloat16)
    leftovers = [p.name for p in (tmp_path / "run" / "extract").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert sorted(p.name for p in (tmp_path / "run" / "extract").glob("data_*.pt")) == \
        sorted(f"data_{i}.pt" for i in range(24))


def test_validation_rejects_nan_and_wrong_shapes(full_run, tmp_path):
    src = full_run["run_dir"] / "extract" / "data_0.pt"
    data = torch.load(src, weights_only=True)
    ids, mask = data["input_ids"].tolist(), data["loss_mask"].tolist()
    validate_sample(src, ids, mask, 4, 64, torch.bfloat16)
    bad = dict(data, hidden_states=[h.clone() for h in data["hidden_states"]])
    bad["hidden_states"][1][3, 5] = float("nan")
    torch.save(bad, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match="NaN or Inf"):
        validate_sample(tmp_path / "nan.pt", ids, mask, 4, 64, torch.bfloat16)
    short = dict(data, hidden_states=[h[:-1] for h in data["hidden_states"]])
    torch.save(short, tmp_path / "short.pt")
    with pytest.raises(ValueError, match="shape"):
        validate_sample(tmp_path / "short.pt", ids, mask, 4, 64, torch.bfloat16)


def test_disk_preflight_sizes(full_run, tmp_path):
    cfg = tracks.load(full_run["config"])
    # Kimi-K2.5: 4 captured layers x 7168 hidden x 2 bytes (bf16) per token
    assert disk.size(cfg, rules, 1, 4, 7168) == 57344
    assert disk.size(cfg, rules, 10_000 * 2048, 4, 7168) == pytest.approx(1.17e12, rel=0.01)
    cfg["extract"]["disk_margin"] = 1e15
    with pytest.raises(PipelineError, match=r"^extract: not enough disk space for .*: needs about [0-9.]+ TiB "
                       r"\(1000 tokens x 512 B/token on the patched track: 4 capture ids x hidden 64 as bfloat16; "
                       r"margin 1e\+15\), [0-9.]+ [KMGT]iB free; .*eagle3_pipeline_work_dir"):
        disk.preflight(cfg, rules, tmp_path, 1000, 4, 64)
    assert not list(tmp_path.iterdir())


def test_vllm_batches_stay_within_the_generators_budget():
    samples = [{"id": i, "input_ids": [0] * n} for i, n in enumerate([2048, 2048, 2048, 2048, 2048, 100])]
    assert [[s["id"] for s in b] for b in pack(samples, 8193, 32, 8)] == [[0, 1, 2, 3], [4, 5]]
    assert [len(b) for b in pack(samples, 8193, 2, 8)] == [2, 2, 2]
    assert [len(b) for b in pack(samples, 8193, 32, 1)] == [1] * 6
    with pytest.raises(PipelineError, match="sample 0 has 2048 tokens, more than the generator's step budget of 100"):
        list(pack(samples, 100, 32, 8))


def test_vllm_plan_check_sees_a_request_split_over_steps():
    assert check_plan([{"req_0_0": 5, "req_0_1": 3}], [5, 3]) is None
    assert check_plan([{"req_0_0": 5}, {"req_0_1": 3}], [5, 3]) is None
    assert "scheduled 2 tokens in step 0 (split over steps)" in check_plan([{"req_0_0": 5, "req_0_1": 2}], [5, 3])
    assert "order [1, 0]" in check_plan([{"req_0_1": 3}, {"req_0_0": 5}], [5, 3])
    assert "order [0]" in check_plan([{"req_0_0": 5}], [5, 3])


def test_data_loads_with_speculators_own_loader(full_run):
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn, split_files

    train, val = split_files(str(full_run["run_dir"] / "extract"), ratio=0.9, seed=0)
    assert len(train) + len(val) == 24 and val
    ds = Eagle3SampleFileDataset(max_len=256, file_list=train)
    item = ds[0]
    n = item["input_ids"].shape[0]
    assert item["hidden_states"].shape == (n, 3 * 64)  # three auxiliary layers concatenated
    assert item["verifier_last_hidden_states"].shape == (n, 64)
    batch = create_collate_fn(256)([ds[i] for i in range(3)])
    assert batch["hidden_states"].shape == (1, 256, 192)


def test_exported_vllm_layer_ids_select_the_captured_tensors(full_run):
    """vLLM feeds the draft the INPUT of each layer in eagle_aux_hidden_state_layer_ids; HF's hidden_states[v]
    is exactly that input (embeddings at 0). The data holds OUTPUTS of the capture layers: the ids must be +1."""
    from transformers import AutoModelForCausalLM

    run_dir = full_run["run_dir"]
    exported = json.loads((run_dir / "export" / "config.json").read_text())
    aux = exported["eagle_aux_hidden_state_layer_ids"]
    assert aux == [3, 5, 6]
    model = AutoModelForCausalLM.from_pretrained(full_run["target"])
    data = torch.load(run_dir / "extract" / "data_5.pt", weights_only=True)
    with torch.no_grad():
        out = model(data["input_ids"][None], output_hidden_states=True)
    for j, v in enumerate(aux):
        assert torch.equal(out.hidden_states[v][0].to(torch.bfloat16), data["hidden_states"][j])
        assert not torch.equal(out.hidden_states[v - 1][0].to(torch.bfloat16), data["hidden_states"][j])
    # the last entry (training target) is the last layer's pre-norm output, not HF's normed final state
    last = data["hidden_states"][-1].float()
    normed = model.model.norm(last)
    assert torch.allclose(normed, out.hidden_states[-1][0], atol=0.05)
    assert not torch.allclose(last, out.hidden_states[-1][0], atol=0.05)
