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


def target_config(cfg):
    return _load(cfg["target"]["path"], bool(cfg["target"]["trust_remote_code"]))


def text_config(cfg):
    conf = target_config(cfg)
    return getattr(conf, "text_config", None) or conf


def dtype_of(cfg):
    return getattr(text_config(cfg), "torch_dtype", None)
