"""KimiK25Config for the mini-Kimi: the configuration class of config.json's auto_map (AutoConfig).

Kimi-K2.5's checkpoint ships a configuration module because transformers releases before 5 have no `kimi_k25`
class; the mini-Kimi does the same, so that transformers 4.57 (the patched track's) reads it through
AutoConfig.from_pretrained(path, trust_remote_code=True). Written for specdec.eagle3 from the checkpoint's
config.json schema, not from the checkpoint's code.

- transformers 5 ships Kimi_K25Config: it is handed back as is. transformers 5.19 runs this module whenever
  trust_remote_code is on (an auto_map wins over its own class), so a run with the switch on meets exactly the
  class it meets with the switch off. vLLM 0.32 reads `kimi_k25` with that class and without remote code.
- transformers 4: a wrapper config whose text_config is transformers' own DeepseekV3Config (the checkpoint's text
  model: MLA, routed experts with noaux_tc routing); its `model_type: kimi_k2` is the DeepSeek-V3 schema under
  Kimi's name, so it is read as DeepseekV3Config. vision_config stays the dict config.json holds: the mini-Kimi
  has no vision weights.
"""

__all__ = ["KimiK25Config"]

try:
    from transformers import Kimi_K25Config as KimiK25Config
except ImportError:  # transformers 4
    from transformers import DeepseekV3Config, PretrainedConfig

    class KimiK25Config(PretrainedConfig):
        """The KimiK25ForConditionalGeneration wrapper's config: text_config is a DeepseekV3Config."""

        model_type = "kimi_k25"
        sub_configs = {"text_config": DeepseekV3Config}

        def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=None,
                     use_unified_vision_chunk=True, tie_word_embeddings=False, **kwargs):
            if not isinstance(text_config, DeepseekV3Config):
                fields = {k: v for k, v in (text_config or {}).items() if k != "model_type"}
                text_config = DeepseekV3Config(**fields)
            self.text_config = text_config
            self.vision_config = dict(vision_config or {})
            self.media_placeholder_token_id = media_placeholder_token_id
            self.use_unified_vision_chunk = use_unified_vision_chunk
            super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
