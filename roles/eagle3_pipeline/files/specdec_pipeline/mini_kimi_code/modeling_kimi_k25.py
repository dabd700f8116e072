"""KimiK25ForConditionalGeneration for the mini-Kimi: the model class of config.json's auto_map (AutoModel,
AutoModelForCausalLM).

Written for specdec.eagle3, not the checkpoint's code. The mini-Kimi has no vision weights, so the model is the
text model alone under the checkpoint's names: `language_model` is transformers' own DeepseekV3ForCausalLM, which
names its tensors as the checkpoint does below that prefix (language_model.model.layers.N..., one tensor per
routed expert, language_model.lm_head.weight). The forward is the text model's.

- transformers 5 ships Kimi_K25ForConditionalGeneration: it is handed back as is (see configuration_kimi_k25).
- transformers 4: the wrapper below.
"""

__all__ = ["KimiK25ForConditionalGeneration"]

try:
    from transformers import Kimi_K25ForConditionalGeneration as KimiK25ForConditionalGeneration
except ImportError:  # transformers 4
    from transformers import DeepseekV3ForCausalLM, PreTrainedModel

    from .configuration_kimi_k25 import KimiK25Config

    class KimiK25ForConditionalGeneration(PreTrainedModel):
        """The wrapper around the text model: language_model is a DeepseekV3ForCausalLM of text_config."""

        config_class = KimiK25Config
        base_model_prefix = "language_model"
        _no_split_modules = ["DeepseekV3DecoderLayer"]

        def __init__(self, config):
            super().__init__(config)
            self.language_model = DeepseekV3ForCausalLM(config.text_config)
            self.post_init()

        def _init_weights(self, module):
            # the text model's own initialisation (its router weights included), not the generic one
            self.language_model._init_weights(module)  # pylint: disable=protected-access

        def get_input_embeddings(self):
            return self.language_model.get_input_embeddings()

        def set_input_embeddings(self, value):
            self.language_model.set_input_embeddings(value)

        def get_output_embeddings(self):
            return self.language_model.get_output_embeddings()

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            return self.language_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
