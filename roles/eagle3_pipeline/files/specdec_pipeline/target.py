"""Facts about the target model read from its config (nested text_config when present, e.g. Kimi-K2.5)."""

from functools import cache

from specdec_pipeline import remote_code
from specdec_pipeline.errors import PipelineError


@cache
def _load(path, trust_remote_code):
    from transformers import AutoConfig  # noqa: PLC0415

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise PipelineError(f"{path}: cannot read the target's config.json ({' '.join(str(exc).split())}); "
                            "check target.path"
                            f"{remote_code.hint(path, trust_remote_code)}.") from None


def load_tokenizer(cfg):
    """The target's tokenizer (its chat template required); one line when it cannot be loaded. CFG["target"]: path,
    trust_remote_code (the stage's switch) and optionally switch (that switch's name, for the hint)."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    path, trust = cfg["target"]["path"], bool(cfg["target"]["trust_remote_code"])
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust, use_fast=cfg["target"].get("use_fast", True))
    except Exception as exc:
        raise PipelineError(f"{path}: cannot load the tokenizer ({' '.join(str(exc).split())}); check target.path"
                            f"{remote_code.hint(path, trust, cfg['target'].get('switch', remote_code.SETTING))}.") from None
    if not getattr(tok, "chat_template", None):
        raise PipelineError(f"{path}: the tokenizer has no chat_template; use the target's own tokenizer "
                            "files (tokenizer_config.json with chat_template).")
    return tok


def target_config(cfg):
    return _load(cfg["target"]["path"], bool(cfg["target"]["trust_remote_code"]))


def text_config(cfg):
    conf = target_config(cfg)
    return getattr(conf, "text_config", None) or conf


def dtype_of(cfg):
    return getattr(text_config(cfg), "torch_dtype", None)
