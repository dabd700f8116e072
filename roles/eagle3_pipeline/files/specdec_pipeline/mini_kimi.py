"""The mini-Kimi target: a seeded random-weight checkpoint with Kimi-K2.5's layout, small enough for 2 CPU cores.

What is Kimi-K2.5's and kept: the wrapper (``KimiK25ForConditionalGeneration``, ``model_type: kimi_k25``) around a
DeepSeek-V3 text config (``text_config.model_type: kimi_k2``) with MLA at the real head sizes (q/k 128 + 64 rope,
v 128, ``kv_lora_rank`` 512: vLLM's MLA takes no other head size), the first layer dense
(``first_k_dense_replace: 1``), routed experts with one shared expert and ``noaux_tc`` sigmoid routing with a
correction bias, YaRN rope, weights named as the real checkpoint names them (``language_model.model.layers.N``,
one tensor per routed expert, ``language_model.lm_head``), a ``preprocessor_config.json`` with ``media_proc_cfg``,
Kimi's special tokens in Kimi's order at the top of the vocabulary and a chat template of the same structure
(system, user and assistant turns, thinking and instant modes), and model code of its own named by config.json's
``auto_map`` (``configuration_kimi_k25.py``, ``modeling_kimi_k25.py``: ours, in mini_kimi_code/), as the real
checkpoint ships code for transformers releases that have no ``kimi_k25`` class.

What is shrunk: hidden size, heads, layers, experts, the vocabulary (a byte-level BPE trained on the dataset, not
Kimi's tiktoken vocabulary). Left out: the vision tower's weights (the target is served language-model-only; its
vision_config is a one-layer MoonViT in the checkpoint's schema) and INT4 routed experts (stored bf16).

Two builders, one checkpoint layout. The builder runs in the venv of the track that uses the target, and each
venv has one transformers: the current track's 5.19 ships ``Kimi_K25ForConditionalGeneration``, the patched
track's 4.57 does not (but has DeepSeek-V3). So the weights are drawn by the transformers at hand:
- transformers 5: its own ``Kimi_K25ForConditionalGeneration``; the tensors it names otherwise (``model.`` prefixes,
  fused experts) are renamed to the checkpoint's names (checkpoint_names);
- transformers 4: mini_kimi_code's ``KimiK25ForConditionalGeneration``, whose ``language_model`` is transformers'
  own ``DeepseekV3ForCausalLM``: it names its tensors as the checkpoint does.
Both write the same config.json (wrapper_config), vocabulary, merges and special tokens (each library writes its
own tokenizer_config.json), processor file and model code, and both are checked against one list of tensor names
and shapes (tensor_layout) before anything is written. The weights' values
differ between the two (each library draws its own initialisation from the seed); for the same weights,
transformers 4.57 (through mini_kimi_code) and 5.19 give the same forward (measured once: float32 logits within
3e-7). The alternatives were worse: a checkpoint built once and kept in the repository is a 23 MB binary that no
longer follows the builder, and building it with transformers 5 beside the patched track's venv would put a second
transformers on the hosts of a track that does not use it. The stamp names the builder, so a directory built by
the other one is rebuilt rather than taken as up to date.
"""

import json
from pathlib import Path

from specdec_pipeline.datasets_io import load_local
from specdec_pipeline.fsutil import read_json, sha256_file, write_bytes_atomic, write_json

# Kimi-K2.5's special tokens, offset from the first special id (163584 in the real vocabulary): the same order, so
# that bos/eos/pad/media ids keep their distance from each other. None marks a reserved slot.
SPECIAL_SLOTS = 256
SPECIAL = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
           6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
           11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
           14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
           18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
           22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}

# Same structure as Kimi-K2.5's template: <|im_{role}|>{role}<|im_middle|>...<|im_end|>; assistant turns carry
# <think>reasoning</think> (reasoning only on turns after the last user turn); the generation prompt ends in
# <think> (thinking, the default) or <think></think> (thinking=false, instant mode).
CHAT_TEMPLATE = (
    "{%- set thinking = thinking if thinking is defined else true -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 > ns.last_user and m.get('reasoning_content') -%}"
    "<think>{{ m['reasoning_content'] }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking -%}<think>{%- else -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
)

# The named shape: hidden size, heads, layers and experts shrunk; MLA ranks at Kimi-K2.5's values.
SHAPE = {"hidden_size": 256, "layers": 8, "heads": 2, "q_lora_rank": 96, "kv_lora_rank": 512,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 512,
         "moe_intermediate_size": 128, "experts": 8, "experts_per_tok": 2, "shared_experts": 1,
         "first_k_dense_replace": 1, "bpe_vocab": 768}
VISION = {"patch_size": 14, "init_pos_emb_height": 4, "init_pos_emb_width": 4, "init_pos_emb_time": 4,
          "pos_emb_type": "divided_fixed", "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
          "intermediate_size": 128, "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
          "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "mm_hidden_size": 64,
          "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05}
# The real checkpoint's preprocessor_config.json schema (values of its MoonViT media processor).
MEDIA_PROC_CFG = {"in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5],
                  "image_std": [0.5, 0.5, 0.5], "merge_kernel_size": 2, "fixed_output_tokens": None,
                  "patch_limit_on_one_side": 512, "in_patch_limit_each_frame": 4096,
                  "temporal_merge_kernel_size": 4, "sample_fps": 2.0, "timestamp_mode": "hh:mm:ss.fff"}
ROPE = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "rope_theta": 50000.0,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
WEIGHTS = "model.safetensors"
STAMP = "specdec_mini_kimi.json"
# The model code the checkpoint carries (ours: mini_kimi_code/) and config.json's auto_map naming it, with the
# real checkpoint's file and class names.
CODE_DIR = Path(__file__).with_name("mini_kimi_code")
CODE_FILES = ("configuration_kimi_k25.py", "modeling_kimi_k25.py")
AUTO_MAP = {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"}
BUILDERS = {5: "transformers 5: Kimi_K25ForConditionalGeneration",
            4: "transformers 4: DeepseekV3ForCausalLM as language_model"}


def special_ids(base):
    return {name: base + off for off, name in SPECIAL.items()}


def _tokenizer(texts, bpe_vocab):
    """A byte-level BPE trained on TEXTS, then Kimi's 256 special slots above it (a fast tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    base = tok.get_vocab_size()
    names = [SPECIAL.get(i, f"<|reserved_token_{i}|>") for i in range(SPECIAL_SLOTS)]
    tok.add_special_tokens(names)
    if tok.token_to_id("[BOS]") != base or tok.token_to_id("[PAD]") != base + SPECIAL_SLOTS - 1:
        raise RuntimeError("mini-Kimi tokenizer: special tokens did not land above the BPE vocabulary")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]",
                                   pad_token="[PAD]", model_max_length=262144)
    fast.chat_template = CHAT_TEMPLATE
    return fast, base


def text_config(shape, vocab_size, base):
    ids = special_ids(base)
    return {
        "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": vocab_size,
        "hidden_size": shape["hidden_size"], "intermediate_size": shape["intermediate_size"],
        "moe_intermediate_size": shape["moe_intermediate_size"], "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"], "num_key_value_heads": shape["heads"],
        "n_shared_experts": shape["shared_experts"], "n_routed_experts": shape["experts"],
        "num_experts_per_tok": shape["experts_per_tok"], "first_k_dense_replace": shape["first_k_dense_replace"],
        "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.827, "q_lora_rank": shape["q_lora_rank"],
        "kv_lora_rank": shape["kv_lora_rank"], "qk_nope_head_dim": shape["qk_nope_head_dim"],
        "qk_rope_head_dim": shape["qk_rope_head_dim"], "v_head_dim": shape["v_head_dim"], "hidden_act": "silu",
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-05, "rope_theta": ROPE["rope_theta"],
        "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"} | {"type": "yarn"},
        "rope_parameters": dict(ROPE), "attention_bias": False, "attention_dropout": 0.0,
        "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "initializer_range": 0.02,
        "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"],
        "dtype": "bfloat16",
    }


def wrapper_config(shape, vocab_size, base):
    """config.json as the checkpoint has it: KimiK25ForConditionalGeneration around the kimi_k2 text config."""
    ids = special_ids(base)
    return {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": text_config(shape, vocab_size, base), "vision_config": dict(VISION),
        "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"],
        "media_placeholder_token_id": ids["<|media_pad|>"], "image_token_id": ids["<|media_pad|>"],
        "vision_start_token_id": ids["<|media_begin|>"], "vision_end_token_id": ids["<|media_end|>"],
        "video_token_id": vocab_size, "projection_hidden_size": VISION["mm_hidden_size"],
        "use_unified_vision_chunk": True, "tie_word_embeddings": False, "dtype": "bfloat16",
    }


def checkpoint_names(state, n_experts):
    """{checkpoint name: tensor} from transformers 5's Kimi_K25ForConditionalGeneration state dict: the text model
    under language_model.model, the head as language_model.lm_head, one gate/up/down tensor per routed expert
    (transformers keeps them fused as [E, 2I, H] and [E, H, I]); the vision tower and projector left out."""
    out = {}
    for name, tensor in state.items():
        if name.startswith(("model.vision_tower.", "model.mm_projector.")):
            continue
        if name == "lm_head.weight":
            out["language_model.lm_head.weight"] = tensor
            continue
        if not name.startswith("model.language_model."):
            raise ValueError(f"mini-Kimi: unexpected tensor {name} in the transformers model")
        rest = name.removeprefix("model.language_model.")
        key = "language_model.model." + rest
        if rest.endswith("mlp.experts.gate_up_proj"):
            stem = key.removesuffix("gate_up_proj")
            inter = tensor.shape[1] // 2
            for e in range(n_experts):
                out[f"{stem}{e}.gate_proj.weight"] = tensor[e, :inter].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = tensor[e, inter:].contiguous()
        elif rest.endswith("mlp.experts.down_proj"):
            stem = key.removesuffix("down_proj")
            for e in range(n_experts):
                out[f"{stem}{e}.down_proj.weight"] = tensor[e].contiguous()
        else:
            out[key] = tensor
    return out


def tensor_layout(shape, vocab_size):
    """{name: shape} of every tensor in the mini-Kimi's model.safetensors: Kimi-K2.5's names for its text model
    (MLA projections, the dense first layers' MLP, the router with its correction bias, the shared expert and one
    gate/up/down tensor per routed expert) at SHAPE's sizes. Both builders are checked against it."""
    h, heads, experts = shape["hidden_size"], shape["heads"], shape["experts"]
    nope, rope, v_dim = shape["qk_nope_head_dim"], shape["qk_rope_head_dim"], shape["v_head_dim"]
    q_lora, kv_lora = shape["q_lora_rank"], shape["kv_lora_rank"]
    moe, shared = shape["moe_intermediate_size"], shape["moe_intermediate_size"] * shape["shared_experts"]

    def mlp(stem, width):
        return {f"{stem}gate_proj.weight": [width, h], f"{stem}up_proj.weight": [width, h],
                f"{stem}down_proj.weight": [h, width]}

    out = {"language_model.lm_head.weight": [vocab_size, h],
           "language_model.model.embed_tokens.weight": [vocab_size, h], "language_model.model.norm.weight": [h]}
    for i in range(shape["layers"]):
        p = f"language_model.model.layers.{i}."
        out.update({f"{p}input_layernorm.weight": [h], f"{p}post_attention_layernorm.weight": [h],
                    f"{p}self_attn.q_a_proj.weight": [q_lora, h], f"{p}self_attn.q_a_layernorm.weight": [q_lora],
                    f"{p}self_attn.q_b_proj.weight": [heads * (nope + rope), q_lora],
                    f"{p}self_attn.kv_a_proj_with_mqa.weight": [kv_lora + rope, h],
                    f"{p}self_attn.kv_a_layernorm.weight": [kv_lora],
                    f"{p}self_attn.kv_b_proj.weight": [heads * (nope + v_dim), kv_lora],
                    f"{p}self_attn.o_proj.weight": [h, heads * v_dim]})
        if i < shape["first_k_dense_replace"]:
            out.update(mlp(f"{p}mlp.", shape["intermediate_size"]))
            continue
        out.update({f"{p}mlp.gate.weight": [experts, h], f"{p}mlp.gate.e_score_correction_bias": [experts]})
        out.update(mlp(f"{p}mlp.shared_experts.", shared))
        for e in range(experts):
            out.update(mlp(f"{p}mlp.experts.{e}.", moe))
    return out


def layout_problem(tensors, shape, vocab_size):
    """'' when TENSORS ({name: tensor}) are exactly tensor_layout's names and shapes, in bf16; else what differs."""
    want = tensor_layout(shape, vocab_size)
    got = {name: list(t.shape) for name, t in tensors.items()}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    wrong = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    not_bf16 = sorted(n for n, t in tensors.items() if str(t.dtype) != "torch.bfloat16")
    parts = [f"{what} {names[:3]}{' ...' if len(names) > 3 else ''}" for what, names in
             (("missing", missing), ("unexpected", extra), ("wrong shape", wrong), ("not bf16", not_bf16)) if names]
    return "; ".join(parts)


def transformers_major():
    """The major version of the installed transformers, read without importing it."""
    from importlib.metadata import version  # noqa: PLC0415

    return int(version("transformers").split(".")[0])


def _bias_the_routers(layers, torch):
    # transformers starts the routers' correction bias at zero; the checkpoint's is learned: make it count.
    with torch.no_grad():
        for layer in layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                gate.e_score_correction_bias.copy_(torch.rand(gate.e_score_correction_bias.shape) * 0.02)


def _weights_transformers5(cfg_json, seed, shape, torch):
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration  # noqa: PLC0415

    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(Kimi_K25Config(**json.loads(json.dumps(cfg_json)))).eval()
    _bias_the_routers(model.model.language_model.layers, torch)
    model = model.to(torch.bfloat16)
    return checkpoint_names({k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
                            shape["experts"])


def _weights_transformers4(cfg_json, seed, torch):
    from specdec_pipeline.mini_kimi_code.configuration_kimi_k25 import KimiK25Config  # noqa: PLC0415
    from specdec_pipeline.mini_kimi_code.modeling_kimi_k25 import KimiK25ForConditionalGeneration  # noqa: PLC0415

    torch.manual_seed(seed)
    model = KimiK25ForConditionalGeneration(KimiK25Config(**json.loads(json.dumps(cfg_json)))).eval()
    _bias_the_routers(model.language_model.model.layers, torch)
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}


def build(dataset, out, seed=0, shape=None):
    """Build the mini-Kimi in OUT; False (nothing touched) when OUT was built from the same inputs by the same
    builder (the installed transformers' major version picks it, see the module docstring)."""
    out = Path(out)
    shape = {**SHAPE, **(shape or {})}
    major = transformers_major()
    builder = BUILDERS[5 if major >= 5 else 4]
    spec = {"dataset_sha256": sha256_file(dataset), "seed": seed, "shape": shape, "template": CHAT_TEMPLATE,
            "vision": VISION, "media_proc_cfg": MEDIA_PROC_CFG, "rope": ROPE, "auto_map": AUTO_MAP,
            "code": {name: sha256_file(CODE_DIR / name) for name in CODE_FILES}, "builder": builder, "format": 2}
    if read_json(out / STAMP) == spec and (out / WEIGHTS).exists():
        return False
    import torch  # noqa: PLC0415
    from safetensors.torch import save  # noqa: PLC0415

    texts = [m["content"] for conv in load_local(dataset) for m in conv]
    tok, base = _tokenizer(texts, shape["bpe_vocab"])
    vocab = base + SPECIAL_SLOTS
    cfg_json = wrapper_config(shape, vocab, base)
    if major >= 5:
        tensors = _weights_transformers5(cfg_json, seed, shape, torch)
    else:
        tensors = _weights_transformers4(cfg_json, seed, torch)
    problem = layout_problem(tensors, shape, vocab)
    if problem:
        raise RuntimeError(f"mini-Kimi ({builder}): the tensors differ from Kimi-K2.5's layout: {problem}")
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    write_json(out / "generation_config.json", {"bos_token_id": base, "eos_token_id": special_ids(base)["<|im_end|>"],
                                                "max_length": 262144})
    write_json(out / "preprocessor_config.json", {"media_proc_cfg": MEDIA_PROC_CFG})
    for name in CODE_FILES:
        write_bytes_atomic(out / name, (CODE_DIR / name).read_bytes())
    write_json(out / "config.json", {**cfg_json, "auto_map": dict(AUTO_MAP)})
    write_bytes_atomic(out / WEIGHTS, save(tensors, metadata={"format": "pt"}))
    (out / "README.md").write_text(
        "mini-Kimi: a random-weight Kimi-K2.5-layout checkpoint built by specdec_pipeline.mini_kimi from "
        f"{Path(dataset).name} (seed {seed}, {builder}); for pipeline tests only.\n")
    write_json(out / STAMP, spec)
    return True


def layer_ids(n_layers):
    """vLLM's default capture ids for N layers: 2, N//2, N-3 and N (the final layer's output)."""
    return [2, n_layers // 2, n_layers - 3, n_layers]
