"""Llama 3.2 Vision model builders: the released sizes (11B and 90B, instruct and base share dimensions).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama3_2_vision` and
:func:`lora_llama3_2_vision`) and the Hugging Face repo whose ``config.json`` they are. Both sizes share the encoder:
CLIP ViT-H/14 (1280 wide, 32 + 8 layers) at 560-pixel tiles, up to 4 tiles per image. ``llama3_2_vision_*`` builders
take torchtune's three trainable switches; ``lora_*`` builders take ``"frozen" | "lora" | "full"`` for each part and
torchtune's LoRA arguments; ``qlora_*`` builders are the ``lora_*`` ones with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, qlora_builder
from tune.models.llama3_2_vision._component_builders import llama3_2_vision, lora_llama3_2_vision
from tune.modules.model_fusion import DeepFusionModel

_VISION = dict(
    patch_size=14, vision_num_heads=16, clip_embed_dim=1280, clip_num_layers=32,
    clip_hidden_states=(3, 7, 15, 23, 30), num_layers_projection=8, max_num_tiles=4,
)  # fmt: skip
# 20 images of 4 tiles of 1601 tokens (560-pixel tiles): the longest encoder sequence torchtune's builders record
_ENCODER_MAX_SEQ_LEN = 128_080

# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "llama3_2_vision_11b": ModelSize("meta-llama/Llama-3.2-11B-Vision-Instruct", dict(
        vocab_size=128_256, num_layers=32, fusion_interval=4, num_special_tokens=8, num_heads=32, num_kv_heads=8,
        embed_dim=4096, max_seq_len=131_072, encoder_max_seq_len=_ENCODER_MAX_SEQ_LEN, rope_base=500_000.0,
        intermediate_dim=14_336, norm_eps=1e-5, scale_factor=8.0, **_VISION)),
    "llama3_2_vision_90b": ModelSize("meta-llama/Llama-3.2-90B-Vision-Instruct", dict(
        vocab_size=128_256, num_layers=80, fusion_interval=4, num_special_tokens=8, num_heads=64, num_kv_heads=8,
        embed_dim=8192, max_seq_len=131_072, encoder_max_seq_len=_ENCODER_MAX_SEQ_LEN, rope_base=500_000.0,
        intermediate_dim=28_672, norm_eps=1e-5, scale_factor=8.0, **_VISION)),
}
# fmt: on


def _full(
    name: str, decoder_trainable: bool, encoder_trainable: bool, fusion_trainable: bool, image_size: int
) -> DeepFusionModel:
    return llama3_2_vision(
        **MODEL_SIZES[name].dims,
        image_size=image_size,
        decoder_trainable=decoder_trainable,
        encoder_trainable=encoder_trainable,
        fusion_trainable=fusion_trainable,
    )


def _lora(name: str, image_size: int, parts: dict[str, str], lora_args: dict[str, object]) -> DeepFusionModel:
    return lora_llama3_2_vision(**parts, **lora_args, **MODEL_SIZES[name].dims, image_size=image_size)


def llama3_2_vision_11b(
    decoder_trainable: bool = False,
    encoder_trainable: bool = True,
    fusion_trainable: bool = True,
    image_size: int = 560,
) -> DeepFusionModel:
    """Llama 3.2 Vision 11B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``).

    Args:
        decoder_trainable (bool): train the language model's own weights. Default False.
        encoder_trainable (bool): train the CLIP encoder's weights. Default True.
        fusion_trainable (bool): train the fusion weights (global layers, projection, cross-attention layers,
            new token embeddings). Default True.
        image_size (int): tile size in pixels (the image transform's). Default 560.

    Returns:
        DeepFusionModel: the model.
    """
    return _full("llama3_2_vision_11b", decoder_trainable, encoder_trainable, fusion_trainable, image_size)


def llama3_2_vision_90b(
    decoder_trainable: bool = False,
    encoder_trainable: bool = True,
    fusion_trainable: bool = True,
    image_size: int = 560,
) -> DeepFusionModel:
    """Llama 3.2 Vision 90B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``).

    Args:
        decoder_trainable (bool): train the language model's own weights. Default False.
        encoder_trainable (bool): train the CLIP encoder's weights. Default True.
        fusion_trainable (bool): train the fusion weights. Default True.
        image_size (int): tile size in pixels. Default 560.

    Returns:
        DeepFusionModel: the model.
    """
    return _full("llama3_2_vision_90b", decoder_trainable, encoder_trainable, fusion_trainable, image_size)


def lora_llama3_2_vision_11b(
    lora_attn_modules: list[str],
    decoder_trainable: str = "frozen",
    encoder_trainable: str = "lora",
    fusion_trainable: str = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    image_size: int = 560,
) -> DeepFusionModel:
    """:func:`llama3_2_vision_11b` with LoRA adapters where a part is ``"lora"``.

    Each of the three parts is ``"frozen"`` (no gradient), ``"lora"`` (adapters train, base weights frozen) or
    ``"full"`` (every weight trains, no adapters).

    Args:
        lora_attn_modules (list[str]): attention projections to adapt, from ``q_proj, k_proj, v_proj, output_proj``.
        decoder_trainable (str): the language model's own layers. Default ``"frozen"``.
        encoder_trainable (str): the CLIP layers. Default ``"lora"``.
        fusion_trainable (str): global layers, projection, cross-attention layers, new embeddings. Default
            ``"lora"``.
        apply_lora_to_mlp (bool): adapt the feed-forward layers too. Default False.
        apply_lora_to_output (bool): adapt the output projections (decoder output, encoder projection). Default
            False.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator. Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.
        image_size (int): tile size in pixels. Default 560.

    Returns:
        DeepFusionModel: the model.

    Raises:
        ValueError: for a part that is not ``"frozen"``, ``"lora"`` or ``"full"``, or an unknown attention module.
    """
    parts = dict(decoder_trainable=decoder_trainable, encoder_trainable=encoder_trainable,
                 fusion_trainable=fusion_trainable)  # fmt: skip
    lora_args = dict(lora_attn_modules=lora_attn_modules, apply_lora_to_mlp=apply_lora_to_mlp,
                     apply_lora_to_output=apply_lora_to_output, lora_rank=lora_rank, lora_alpha=lora_alpha,
                     lora_dropout=lora_dropout, use_dora=use_dora, quantize_base=quantize_base)  # fmt: skip
    return _lora("llama3_2_vision_11b", image_size, parts, lora_args)


def lora_llama3_2_vision_90b(
    lora_attn_modules: list[str],
    decoder_trainable: str = "frozen",
    encoder_trainable: str = "lora",
    fusion_trainable: str = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    image_size: int = 560,
) -> DeepFusionModel:
    """:func:`llama3_2_vision_90b` with LoRA adapters where a part is ``"lora"``; arguments as in
    :func:`lora_llama3_2_vision_11b`.

    Args:
        lora_attn_modules (list[str]): attention projections to adapt.
        decoder_trainable (str): ``"frozen"``, ``"lora"`` or ``"full"``. Default ``"frozen"``.
        encoder_trainable (str): as above. Default ``"lora"``.
        fusion_trainable (str): as above. Default ``"lora"``.
        apply_lora_to_mlp (bool): adapt the feed-forward layers too. Default False.
        apply_lora_to_output (bool): adapt the output projections. Default False.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator. Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.
        image_size (int): tile size in pixels. Default 560.

    Returns:
        DeepFusionModel: the model.

    Raises:
        ValueError: for a part that is not ``"frozen"``, ``"lora"`` or ``"full"``, or an unknown attention module.
    """
    parts = dict(decoder_trainable=decoder_trainable, encoder_trainable=encoder_trainable,
                 fusion_trainable=fusion_trainable)  # fmt: skip
    lora_args = dict(lora_attn_modules=lora_attn_modules, apply_lora_to_mlp=apply_lora_to_mlp,
                     apply_lora_to_output=apply_lora_to_output, lora_rank=lora_rank, lora_alpha=lora_alpha,
                     lora_dropout=lora_dropout, use_dora=use_dora, quantize_base=quantize_base)  # fmt: skip
    return _lora("llama3_2_vision_90b", image_size, parts, lora_args)


qlora_llama3_2_vision_11b = qlora_builder(lora_llama3_2_vision_11b)
qlora_llama3_2_vision_90b = qlora_builder(lora_llama3_2_vision_90b)
