"""The mini-Kimi (Kimi-K2.5's layout at 8 layers, random weights) as transformers 4.57 meets it: built by the
DeepseekV3ForCausalLM builder, read through the checkpoint's own code (auto_map). One mini-Kimi per session
(conftest.mini_kimi).

Run with the pipeline venv: .cache/venvs/pipeline/bin/python -m pytest tests/pipeline/test_mini_kimi.py
"""

import pytest
import torch
from conftest import write_config
from safetensors import safe_open

from specdec_pipeline.mini_kimi import SHAPE, tensor_layout


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
    from specdec_pipeline import config, target  # noqa: PLC0415
    from specdec_pipeline.errors import PipelineError  # noqa: PLC0415

    cfg = config.load(write_config(tmp_path / "run.json", tmp_path / "run", mini_kimi, track="patched"))
    with pytest.raises(PipelineError) as exc:  # the run's first look at the target (its settings check)
        target.text_config(cfg)
    text = str(exc.value)
    assert "\n" not in text and "contains custom code which must be executed" in text, text
    assert ("the target names its own code (configuration_kimi_k25.py, modeling_kimi_k25.py) and "
            "eagle3_pipeline_trust_remote_code is false") in text
