"""Gemma 2: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.gemma2 import _component_builders, _model_builders
from tune.models.gemma2._component_builders import gemma2, lora_gemma2
from tune.models.gemma2._convert_weights import gemma2_from_hf_config, gemma2_hf_to_tune, gemma2_tune_to_hf
from tune.models.gemma2._model_builders import (
    gemma2_2b,
    gemma2_9b,
    gemma2_27b,
    lora_gemma2_2b,
    lora_gemma2_9b,
    lora_gemma2_27b,
    qlora_gemma2_2b,
    qlora_gemma2_9b,
    qlora_gemma2_27b,
)
from tune.models.gemma2._tokenizer import GemmaTokenizer, gemma2_tokenizer, gemma_tokenizer
from tune.registry import ModelFamily, TorchtuneLayout

FAMILY = ModelFamily(
    name="gemma2",
    tokenizer=gemma2_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=gemma2_hf_to_tune,
    tune_to_hf=gemma2_tune_to_hf,
    hf_model_types=("gemma2",),
    from_hf_config=gemma2_from_hf_config,
    aliases=(),
    # torchtune wraps the final norm (norm.rms_norm), and torchtune 0.6.1's converter puts Hugging Face's
    # post-feed-forward norm in mlp_norm and the pre-feed-forward one in mlp_scale, the reverse of tune's (and of
    # where its own layer applies them): read back, its files give the model its Hugging Face export computes
    torchtune_layout=TorchtuneLayout(
        interleaved_rope=True,
        key_renames=(
            (r"^norm\.rms_norm\.", "norm."),
            (r"^(layers\.\d+)\.mlp_norm\.", r"\1.mlp_scale."),
            (r"^(layers\.\d+)\.mlp_scale\.", r"\1.mlp_norm."),
        ),
    ),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "GemmaTokenizer",
    "gemma2",
    "gemma2_27b",
    "gemma2_2b",
    "gemma2_9b",
    "gemma2_from_hf_config",
    "gemma2_hf_to_tune",
    "gemma2_tokenizer",
    "gemma2_tune_to_hf",
    "gemma_tokenizer",
    "lora_gemma2",
    "lora_gemma2_27b",
    "lora_gemma2_2b",
    "lora_gemma2_9b",
    "qlora_gemma2_27b",
    "qlora_gemma2_2b",
    "qlora_gemma2_9b",
]
