"""The tiny profile's target: a Llama-style model with random weights and a SentencePiece tokenizer,
both built locally from the conversation dataset (nothing is downloaded).

The tokenizer is saved in its slow (Python, SentencePiece) form, like Kimi-K2.5's tiktoken tokenizer:
prepare must build loss masks without offset mappings.
"""

import json
import sys
import tempfile
from pathlib import Path

from specdec_pipeline.datasets_io import load_local
from specdec_pipeline.fsutil import read_json, sha256_file, write_json

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def build(dataset, out, vocab_size=512, hidden_size=64, layers=8, heads=4, kv_heads=2, seed=0):
    """Build the tiny target in OUT (idempotent: skipped when OUT was built from the same inputs, before
    torch and transformers are imported, so a re-run costs a file hash)."""
    out = Path(out)
    spec = {"dataset_sha256": sha256_file(dataset), "vocab_size": vocab_size, "hidden_size": hidden_size,
            "layers": layers, "heads": heads, "kv_heads": kv_heads, "seed": seed, "template": CHAT_TEMPLATE}
    if read_json(out / "specdec_tiny.json") == spec and (out / "model.safetensors").exists():
        return False
    import sentencepiece as spm  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    texts = [m["content"] for conv in load_local(dataset) for m in conv]
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(texts) + "\n")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(Path(tmp) / "tok"), vocab_size=vocab_size, model_type="bpe",
            user_defined_symbols=SPECIAL, byte_fallback=True, num_threads=1, normalization_rule_name="identity",
            remove_extra_whitespaces=False, split_digits=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
            minloglevel=2, hard_vocab_limit=False)
        # Loaded from a folder holding tokenizer.model: transformers 4.x gives the slow tokenizer, 5.x converts
        # the SentencePiece model (LlamaTokenizer(vocab_file=...) yields an empty vocabulary under 5.x).
        (Path(tmp) / "tok.model").rename(Path(tmp) / "tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(tmp, legacy=False, add_bos_token=False)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(out)
    torch.manual_seed(seed)
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                       torch_dtype="float32")
    model = LlamaForCausalLM(conf)
    model.save_pretrained(out, safe_serialization=True)
    write_json(out / "specdec_tiny.json", spec)
    (out / "README.md").write_text("Tiny random-weight Llama target built by specdec_pipeline.tiny "
                                   f"from {Path(dataset).name}; for pipeline tests only.\n")
    return True


SHAPES = ("hidden_size", "layers", "heads", "kv_heads")


def parse_shape(text):
    """'heads=2,kv_heads=1' -> {"heads": 2, "kv_heads": 1}; the head size is hidden_size // heads.

    vLLM's CPU attention takes head sizes 32, 64, 80, ... only: hidden_size=64,heads=2,kv_heads=1 gives 32.
    """
    shape = {}
    for part in [p for p in (text or "").split(",") if p.strip()]:
        key, dummy, value = part.partition("=")
        key = key.strip()
        if key not in SHAPES or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"tiny target shape {text!r}: expected comma-separated KEY=N with KEY in "
                             f"{', '.join(SHAPES)} and N >= 1, e.g. heads=2,kv_heads=1")
        shape[key] = int(value)
    merged = {"hidden_size": 64, "heads": 4, "kv_heads": 2, **shape}
    if merged["hidden_size"] % merged["heads"] or merged["heads"] % merged["kv_heads"]:
        raise ValueError(f"tiny target shape {text!r}: hidden_size must be a multiple of heads and heads a "
                         "multiple of kv_heads")
    return shape


# Named shapes: another architecture, built by its own module (the shape's other keys are refused).
NAMED = {"kimi": "Kimi-K2.5's layout in miniature (specdec_pipeline.mini_kimi)"}


def main(argv, shape=""):
    name = (shape or "").strip()
    if name in NAMED:
        from specdec_pipeline import mini_kimi  # noqa: PLC0415

        try:
            changed = mini_kimi.build(argv[0], argv[1])
        except RuntimeError as exc:  # the builder's own checks (tokenizer, tensor layout): one line, no traceback
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({"changed": changed, "path": argv[1]}))
        return 0
    try:
        kwargs = parse_shape(shape)
    except ValueError as exc:
        print(f"ERROR: {exc} (or a named shape: {', '.join(NAMED)})", file=sys.stderr)
        return 2
    changed = build(argv[0], argv[1], **kwargs)
    print(json.dumps({"changed": changed, "path": argv[1]}))
    return 0
