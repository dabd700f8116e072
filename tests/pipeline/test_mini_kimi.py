"""The mini-Kimi (Kimi-K2.5's layout at 8 layers, random weights) as transformers 4.57 meets it - built by the
DeepseekV3ForCausalLM builder, read through its own code named by auto_map - and the patched track's whole run on it
on the CPU: extracted by the transformers backend, trained by speculators 0.3.0 patched with t01-t03, exported in
vLLM's capture convention.

One mini-Kimi per session (conftest.mini_kimi) and one run per module: prepare (thinking mode), extract (the patched
track's default capture ids: the outputs of layers 2, 4, 5 and 7), vocab, train (2 epochs on the CPU), export.

Run with the pipeline venv: .cache/venvs/pipeline/bin/python -m pytest tests/pipeline/test_mini_kimi.py
"""

import json

import pytest
import torch
from conftest import pipeline, write_config
from safetensors import safe_open

from specdec_pipeline.mini_kimi import SHAPE, tensor_layout

SAMPLES = 8


@pytest.fixture(scope="module")
def reference(mini_kimi):
    """The mini-Kimi through transformers 4.57 and its own code, in its own dtype (bf16), as the backend loads it."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model, info = AutoModelForCausalLM.from_pretrained(str(mini_kimi), trust_remote_code=True, dtype="auto",
                                                       output_loading_info=True)
    return model.eval(), info


def test_transformers_4_reads_the_mini_kimi_only_through_its_own_code(mini_kimi, reference):
    from transformers import AutoConfig, DeepseekV3Config  # noqa: PLC0415

    conf = AutoConfig.from_pretrained(str(mini_kimi), trust_remote_code=True)
    assert (type(conf).__name__, conf.model_type) == ("KimiK25Config", "kimi_k25")
    assert type(conf).__module__.startswith("transformers_modules.")  # the checkpoint's configuration_kimi_k25.py
    tc = conf.text_config
    assert isinstance(tc, DeepseekV3Config) and not hasattr(conf, "hidden_size")
    assert (tc.hidden_size, tc.num_hidden_layers, tc.kv_lora_rank, tc.qk_nope_head_dim, tc.qk_rope_head_dim,
            tc.v_head_dim, tc.n_routed_experts, tc.first_k_dense_replace) == (256, 8, 512, 128, 64, 128, 8, 1)
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        AutoConfig.from_pretrained(str(mini_kimi), trust_remote_code=False)
    # The checkpoint: Kimi-K2.5's tensor names (the one layout both builders are checked against), all of them
    # loaded into the wrapper around transformers' DeepseekV3ForCausalLM, nothing left over.
    with safe_open(str(mini_kimi / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    assert shapes == tensor_layout(SHAPE, tc.vocab_size)
    model, info = reference
    assert type(model).__name__ == "KimiK25ForConditionalGeneration"
    assert type(model.language_model).__name__ == "DeepseekV3ForCausalLM"
    assert {k: v for k, v in info.items() if v} == {}  # no missing, unexpected or mismatched keys


def test_with_trust_remote_code_off_the_run_is_refused_in_one_line(mini_kimi, tmp_path):
    from specdec_pipeline import target, tracks  # noqa: PLC0415
    from specdec_pipeline.errors import PipelineError  # noqa: PLC0415

    cfg = tracks.load(write_config(tmp_path / "run.json", tmp_path / "run", mini_kimi, track="patched"))
    with pytest.raises(PipelineError) as exc:  # the run's first look at the target (its settings check)
        target.text_config(cfg)
    text = str(exc.value)
    assert "\n" not in text and "contains custom code which must be executed" in text, text
    assert ("the target names its own code (configuration_kimi_k25.py, modeling_kimi_k25.py) and "
            "eagle3_pipeline_trust_remote_code is false") in text


@pytest.fixture(scope="module")
def kimi_run(tmp_path_factory, mini_kimi, speculators_site):
    """The patched track's whole run on the mini-Kimi, speculators 0.3.0 patched with t01-t03 first on the path."""
    base = tmp_path_factory.mktemp("kimi-run")
    cfg = write_config(base / "run.json", base / "run", mini_kimi, track="patched", chat_mode="thinking",
                       dataset={"max_samples": SAMPLES}, extract={"backend": "transformers"},
                       train={"epochs": 2, "total_seq_len": 256, "lr": 3e-3})
    settings = json.loads(cfg.read_text())
    settings["target"]["trust_remote_code"] = True  # as on the Kimi host (eagle3_pipeline_trust_remote_code)
    cfg.write_text(json.dumps(settings))
    proc = pipeline(cfg, "run", pythonpath=[speculators_site("t01", "t02", "t03")])
    return {"run_dir": base / "run", "summary": json.loads(proc.stdout.strip().splitlines()[-1]), "log": proc.stderr}


def test_the_patched_track_runs_on_the_mini_kimi_through_its_own_code(kimi_run):
    assert kimi_run["summary"]["ran"] == ["regenerate", "prepare", "extract", "vocab", "train", "export"], \
        kimi_run["summary"]
    # the run names the checkpoint's code it runs, with its sha256 (trust_remote_code on)
    assert "configuration_kimi_k25.py runs (trust_remote_code on)" in kimi_run["log"]
    assert "modeling_kimi_k25.py runs (trust_remote_code on)" in kimi_run["log"]
    data_config = json.loads((kimi_run["run_dir"] / "extract" / "data_config.json").read_text())
    assert data_config["layer_ids"] == [2, 4, 5, 7] and data_config["backend"] == "transformers"
    exported = json.loads((kimi_run["run_dir"] / "export" / "config.json").read_text())
    # vLLM's convention (the input of layer k): the outputs of layers 2, 4 and 5 are the inputs of 3, 5 and 6
    assert exported["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert exported["speculators_config"]["verifier"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    with safe_open(str(kimi_run["run_dir"] / "export" / "model.safetensors"), "pt") as f:
        assert list(f.get_slice("fc.weight").get_shape()) == [256, 3 * 256]


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_the_captured_states_are_the_mini_kimis_forward_at_the_exported_ids(kimi_run, reference):
    """The data holds, per sample, the mini-Kimi's own forward (bf16, as the backend runs it) at the exported ids in
    vLLM's convention (hidden_states[v]: the input of layer v), and last the final layer's output before the final
    norm; ids one off are far from it."""
    model, _info = reference
    lm = model.language_model
    exported = json.loads((kimi_run["run_dir"] / "export" / "config.json").read_text())
    aux = exported["eagle_aux_hidden_state_layer_ids"]
    worst, nearest_off = 0.0, 1.0
    for i in (0, SAMPLES - 1):
        data = torch.load(kimi_run["run_dir"] / "extract" / f"data_{i}.pt", weights_only=True)
        seen = {}
        hook = lm.model.norm.register_forward_pre_hook(lambda _m, args: seen.update(last=args[0][0]))
        with torch.no_grad():
            out = model(input_ids=data["input_ids"][None], output_hidden_states=True, use_cache=False)
            hook.remove()
            ref = out.hidden_states  # [v] = the input of layer v (embeddings at 0): vLLM's id v
            stored = data["hidden_states"]
            assert len(stored) == 4 and all(h.dtype == torch.bfloat16 and h.norm(dim=-1).min() > 0 for h in stored)
            for j, v in enumerate(aux):
                worst = max(worst, _rel(stored[j], ref[v][0]))
                nearest_off = min(nearest_off, _rel(stored[j], ref[v - 1][0]), _rel(stored[j], ref[v + 1][0]))
            # the last entry (what the training targets come from) through the model's own final norm and lm head
            # is the model's logits, as t03 makes the trainer compute them
            logits = lm.lm_head(lm.model.norm(stored[-1]))
            worst = max(worst, _rel(stored[-1], seen["last"]), _rel(logits, out.logits[0]))
            nearest_off = min(nearest_off, _rel(stored[-1], ref[-1][0]))
    # the same bf16 computation in another process: equal up to the order of summation (measured: 0)
    assert worst < 1e-3, f"captured vs transformers forward: relative error {worst:.2e}"
    assert nearest_off > 0.3, f"ids one off are as close as {nearest_off:.4f}: the comparison cannot tell layers apart"


def test_training_on_the_mini_kimi_is_finite_and_the_loss_falls(kimi_run):
    rows = [json.loads(x) for x in (kimi_run["run_dir"] / "train" / "metrics.jsonl").read_text().splitlines() if x]
    train = [(r["epoch"], r["train"]["loss"]) for r in rows if "train" in r]
    val = [r["val"]["loss_epoch"] for r in rows if "val" in r]
    assert len(train) >= 4 and len(val) == 2, rows
    assert all(torch.isfinite(torch.tensor([loss for _e, loss in train] + val))), rows

    def mean(epoch):
        losses = [loss for e, loss in train if e == epoch]
        return sum(losses) / len(losses)

    # against the mini-Kimi's own logits (t03): the second epoch's training loss and the held-out sample's loss fall
    assert mean(1) < 0.8 * mean(0) and val[1] < 0.8 * val[0], (train, val)
