"""Gemma 3 with images, model builders: the released multimodal sizes (4B, 12B, 27B).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`gemma3_vision`) and the Hugging Face
repo whose ``config.json`` they are. The language model of each is the ``gemma3`` family's size of the same name
(its table's row, read here so the two cannot drift apart); all three share one vision tower, SigLIP so400m at
896 x 896 pixels in 14-pixel patches, pooled to 256 image tokens. A ``lora_*`` builder takes torchtune's LoRA
arguments plus the three trainable choices; a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from collections.abc import Callable, Sequence

from tune.models._common import ModelSize, qlora_builder
from tune.models.gemma3 import FAMILY as _TEXT_FAMILY
from tune.models.gemma3_vision._component_builders import IMAGE_TOKEN_ID, gemma3_vision, lora_gemma3_vision
from tune.models.gemma3_vision._model import Gemma3VisionLanguageModel

# SigLIP so400m/14 at 896 pixels (the vision_config of google/gemma-3-{4b,12b,27b}-it), and the projector's output
_VISION_DIMS = dict(
    image_size=896, patch_size=14, vision_embed_dim=1152, vision_num_layers=27, vision_num_heads=16,
    vision_intermediate_dim=4304, vision_norm_eps=1e-6, mm_tokens_per_image=256, image_token_id=IMAGE_TOKEN_ID,
)  # fmt: skip


def _size(text_size: str) -> ModelSize:
    text = _TEXT_FAMILY.sizes[text_size]
    return ModelSize(text.repo, {**text.dims, **_VISION_DIMS})


MODEL_SIZES: dict[str, ModelSize] = {
    "gemma3_vision_4b": _size("gemma3_4b"),
    "gemma3_vision_12b": _size("gemma3_12b"),
    "gemma3_vision_27b": _size("gemma3_27b"),
}


def _lora_size(base: Callable[..., Gemma3VisionLanguageModel]) -> Callable[..., Gemma3VisionLanguageModel]:
    """The ``lora_*`` builder of the named size ``base``."""
    name = base.__name__
    repo = MODEL_SIZES[name].repo

    def builder(
        lora_attn_modules: Sequence[str],
        decoder_trainable: str = "lora",
        encoder_trainable: str = "frozen",
        fusion_trainable: str = "frozen",
        apply_lora_to_mlp: bool = False,
        apply_lora_to_output: bool = False,
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        use_dora: bool = False,
        quantize_base: bool = False,
    ) -> Gemma3VisionLanguageModel:
        return lora_gemma3_vision(
            lora_attn_modules, decoder_trainable, encoder_trainable, fusion_trainable, apply_lora_to_mlp,
            apply_lora_to_output, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
            use_dora=use_dora, quantize_base=quantize_base, **MODEL_SIZES[name].dims,
        )  # fmt: skip

    builder.__name__ = builder.__qualname__ = f"lora_{name}"
    builder.__doc__ = f""":func:`{name}` with fresh LoRA adapters: :func:`lora_gemma3_vision` at the dimensions of
``{repo}``.

Args:
    lora_attn_modules, decoder_trainable, encoder_trainable, fusion_trainable, apply_lora_to_mlp,
        apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora, quantize_base: as in
        :func:`lora_gemma3_vision` (defaults: LoRA in the language model, vision encoder and projector frozen).

Returns:
    Gemma3VisionLanguageModel: the model.

Raises:
    ValueError: as :func:`lora_gemma3_vision`.
"""
    return builder


def gemma3_vision_4b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Gemma3VisionLanguageModel:
    """Gemma 3 4B with images (``google/gemma-3-4b-it``), randomly initialised (load weights with a checkpointer or
    ``tune.models.from_hf``).

    Args:
        decoder_trainable (bool): train the language model. Default True.
        encoder_trainable (bool): train the vision encoder. Default False.
        fusion_trainable (bool): train the projector. Default True.

    Returns:
        Gemma3VisionLanguageModel: the model; the parts that do not train have ``requires_grad=False``.
    """
    return gemma3_vision(
        **MODEL_SIZES["gemma3_vision_4b"].dims,
        decoder_trainable=decoder_trainable,
        encoder_trainable=encoder_trainable,
        fusion_trainable=fusion_trainable,
    )


lora_gemma3_vision_4b = _lora_size(gemma3_vision_4b)
qlora_gemma3_vision_4b = qlora_builder(lora_gemma3_vision_4b)


def gemma3_vision_12b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Gemma3VisionLanguageModel:
    """Gemma 3 12B with images (``google/gemma-3-12b-it``), randomly initialised (load weights with a checkpointer or
    ``tune.models.from_hf``).

    Args:
        decoder_trainable (bool): train the language model. Default True.
        encoder_trainable (bool): train the vision encoder. Default False.
        fusion_trainable (bool): train the projector. Default True.

    Returns:
        Gemma3VisionLanguageModel: the model; the parts that do not train have ``requires_grad=False``.
    """
    return gemma3_vision(
        **MODEL_SIZES["gemma3_vision_12b"].dims,
        decoder_trainable=decoder_trainable,
        encoder_trainable=encoder_trainable,
        fusion_trainable=fusion_trainable,
    )


lora_gemma3_vision_12b = _lora_size(gemma3_vision_12b)
qlora_gemma3_vision_12b = qlora_builder(lora_gemma3_vision_12b)


def gemma3_vision_27b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Gemma3VisionLanguageModel:
    """Gemma 3 27B with images (``google/gemma-3-27b-it``), randomly initialised (load weights with a checkpointer or
    ``tune.models.from_hf``).

    Args:
        decoder_trainable (bool): train the language model. Default True.
        encoder_trainable (bool): train the vision encoder. Default False.
        fusion_trainable (bool): train the projector. Default True.

    Returns:
        Gemma3VisionLanguageModel: the model; the parts that do not train have ``requires_grad=False``.
    """
    return gemma3_vision(
        **MODEL_SIZES["gemma3_vision_27b"].dims,
        decoder_trainable=decoder_trainable,
        encoder_trainable=encoder_trainable,
        fusion_trainable=fusion_trainable,
    )


lora_gemma3_vision_27b = _lora_size(gemma3_vision_27b)
qlora_gemma3_vision_27b = qlora_builder(lora_gemma3_vision_27b)
