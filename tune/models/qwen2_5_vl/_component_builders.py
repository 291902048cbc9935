"""Qwen2.5-VL component builders: the vision encoder (with its patch merger), the language model with M-RoPE, and the
two together, with or without LoRA, each part trainable, frozen or (LoRA builders) adapted.

The language model is Qwen2.5's decoder (:func:`tune.models.qwen2_5.qwen2`: biased q/k/v projections, SwiGLU,
RMSNorm) whose attention layers share one :class:`~tune.modules.MultimodalRotaryEmbeddings` in place of RoPE.
"""

from collections.abc import Sequence
from typing import Any, Literal

from torch import nn

from tune.models._common import LoRASpec, lora_spec, set_part_trainable, trainable_choice
from tune.models.qwen2_5 import lora_qwen2, qwen2
from tune.models.qwen2_5_vl._model import Qwen2_5_VisionLanguageModel
from tune.modules import (
    FeedForward,
    MultiHeadAttention,
    MultimodalRotaryEmbeddings,
    RMSNorm,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)
from tune.modules.peft import DoRALinear, LoRALinear
from tune.modules.vision import QwenPatchMerger, QwenVisionTransformer, VisionRotaryEmbeddings2D

# <|image_pad|> in Qwen2.5-VL's tokenizer (Qwen2_5_VLConfig's default image_token_id)
IMAGE_TOKEN_ID = 151_655
Trainable = Literal["frozen", "lora", "full"]


def _linear(in_dim: int, out_dim: int, *, bias: bool, lora: LoRASpec | None) -> nn.Module:
    """``nn.Linear``, or the LoRA (DoRA) layer ``lora`` asks for."""
    if lora is None:
        return nn.Linear(in_dim, out_dim, bias=bias)
    cls = DoRALinear if lora.use_dora else LoRALinear
    return cls(
        in_dim,
        out_dim,
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        use_bias=bias,
        quantize_base=lora.quantize_base,
    )


def _vision_layer(
    embed_dim: int, num_heads: int, intermediate_dim: int, norm_eps: float, rope: nn.Module, lora: LoRASpec | None
) -> TransformerSelfAttentionLayer:
    attn_lora = set(lora.attn_modules) if lora is not None else set()
    mlp_lora = lora if lora is not None and lora.apply_to_mlp else None

    def projection(name: str) -> nn.Module:
        return _linear(embed_dim, embed_dim, bias=True, lora=lora if name in attn_lora else None)

    attn = MultiHeadAttention(
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=embed_dim // num_heads,
        q_proj=projection("q_proj"),
        k_proj=projection("k_proj"),
        v_proj=projection("v_proj"),
        output_proj=projection("output_proj"),
        pos_embeddings=rope,
        is_causal=False,  # a patch sees every patch of its window (or image)
    )
    mlp = FeedForward(
        gate_proj=_linear(embed_dim, intermediate_dim, bias=True, lora=mlp_lora),
        down_proj=_linear(intermediate_dim, embed_dim, bias=True, lora=mlp_lora),
        up_proj=_linear(embed_dim, intermediate_dim, bias=True, lora=mlp_lora),
        activation=nn.SiLU(),
    )
    return TransformerSelfAttentionLayer(
        attn, mlp, sa_norm=RMSNorm(embed_dim, eps=norm_eps), mlp_norm=RMSNorm(embed_dim, eps=norm_eps)
    )


def _vision_encoder(
    *,
    patch_size: int,
    temporal_patch_size: int,
    in_channels: int,
    embed_dim: int,
    num_layers: int,
    num_heads: int,
    intermediate_dim: int,
    out_dim: int,
    full_attention_layers: Sequence[int],
    window_size: int,
    merge_size: int,
    norm_eps: float,
    rope_base: float,
    lora: LoRASpec | None = None,
    fusion_lora: LoRASpec | None = None,
) -> QwenVisionTransformer:
    if embed_dim % num_heads:
        raise ValueError(f"vision num_heads ({num_heads}) must divide the vision embed_dim ({embed_dim}).")
    rope = VisionRotaryEmbeddings2D(embed_dim // num_heads, base=rope_base)  # shared by all layers
    layers = [_vision_layer(embed_dim, num_heads, intermediate_dim, norm_eps, rope, lora) for _ in range(num_layers)]
    block_dim = embed_dim * merge_size**2
    merger = QwenPatchMerger(
        norm=RMSNorm(embed_dim, eps=1e-6),  # fixed in transformers' merger, whatever the config says
        fc1=_linear(block_dim, block_dim, bias=True, lora=fusion_lora),
        fc2=_linear(block_dim, out_dim, bias=True, lora=fusion_lora),
        merge_size=merge_size,
    )
    return QwenVisionTransformer(
        patch_size=patch_size,
        temporal_patch_size=temporal_patch_size,
        in_channels=in_channels,
        embed_dim=embed_dim,
        layers=layers,
        merger=merger,
        full_attention_layers=full_attention_layers,
        window_size=window_size,
        merge_size=merge_size,
    )


def qwen2_5_vl_vision_encoder(
    *,
    out_dim: int,
    patch_size: int = 14,
    temporal_patch_size: int = 2,
    in_channels: int = 3,
    embed_dim: int = 1280,
    num_layers: int = 32,
    num_heads: int = 16,
    intermediate_dim: int = 3420,
    full_attention_layers: Sequence[int] = (7, 15, 23, 31),
    window_size: int = 112,
    merge_size: int = 2,
    norm_eps: float = 1e-6,
    rope_base: float = 10_000.0,
) -> QwenVisionTransformer:
    """Qwen2.5-VL's vision transformer with its patch merger, randomly initialised. The defaults are the released
    models' (``vision_config`` of ``Qwen/Qwen2.5-VL-7B-Instruct``; 32B and 72B have ``intermediate_dim`` 3456).

    Args:
        out_dim (int): the language model's width (the config's ``out_hidden_size``).
        patch_size (int): side of a patch in pixels. Default 14.
        temporal_patch_size (int): frames per patch. Default 2.
        in_channels (int): image channels. Default 3.
        embed_dim (int): vision width. Default 1280.
        num_layers (int): encoder layers (``depth``). Default 32.
        num_heads (int): attention heads. Default 16.
        intermediate_dim (int): SwiGLU hidden width. Default 3420.
        full_attention_layers (Sequence[int]): layers attending over whole images (``fullatt_block_indexes``); the
            others attend within windows. Default (7, 15, 23, 31).
        window_size (int): side of an attention window in pixels. Default 112.
        merge_size (int): side of a merge block in patches (``spatial_merge_size``). Default 2.
        norm_eps (float): RMSNorm epsilon of the layers. Default 1e-6.
        rope_base (float): theta of the 2-D RoPE. Default 1e4.

    Returns:
        QwenVisionTransformer: ``(pixel_values, image_grid_thw)`` -> [n_patches // merge_size ** 2, out_dim].

    Raises:
        ValueError: for inconsistent sizes.
    """
    return _vision_encoder(**locals())


def _decoder(*, lora: LoRASpec | None, mrope_section: Sequence[int], **dims: Any) -> TransformerDecoder:
    """Qwen2.5's decoder, its RoPE replaced by M-RoPE (one module shared by every layer)."""
    if lora is None:
        decoder = qwen2(**dims)
    else:
        decoder = lora_qwen2(
            lora.attn_modules,
            lora.apply_to_mlp,
            lora.apply_to_output,
            lora_rank=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            use_dora=lora.use_dora,
            quantize_base=lora.quantize_base,
            **dims,
        )
    head_dim = decoder.head_dim
    rope = MultimodalRotaryEmbeddings(
        head_dim, mrope_section=mrope_section, max_seq_len=dims["max_seq_len"], base=dims["rope_base"]
    )
    for layer in decoder.layers:
        layer.attn.pos_embeddings = rope
    return decoder


def qwen2_5_vl(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    mrope_section: Sequence[int] = (16, 24, 24),
    image_token_id: int = IMAGE_TOKEN_ID,
    vision_embed_dim: int = 1280,
    vision_num_layers: int = 32,
    vision_num_heads: int = 16,
    vision_intermediate_dim: int = 3420,
    vision_full_attention_layers: Sequence[int] = (7, 15, 23, 31),
    vision_window_size: int = 112,
    patch_size: int = 14,
    temporal_patch_size: int = 2,
    spatial_merge_size: int = 2,
    in_channels: int = 3,
    vision_norm_eps: float = 1e-6,
    vision_rope_base: float = 10_000.0,
    decoder_trainable: bool = True,
    encoder_trainable: bool = False,
    fusion_trainable: bool = True,
) -> Qwen2_5_VisionLanguageModel:
    """A Qwen2.5-VL model (Qwen Team, 2025, https://arxiv.org/abs/2502.13923), randomly initialised.

    The trainable defaults (language model and merger trained, vision transformer frozen) are those of Qwen's own
    fine-tuning scripts (``tune_mm_llm``, ``tune_mm_mlp``, ``tune_mm_vision``).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): language-model layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.
        embed_dim (int): language-model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (KV-cache default).
        attn_dropout (float): attention dropout of the language model. Default 0.0.
        norm_eps (float): RMSNorm epsilon of the language model. Default 1e-6.
        rope_base (float): M-RoPE theta. Default 1e6.
        tie_word_embeddings (bool): the output projection reuses the token embeddings (3B). Default False.
        mrope_section (Sequence[int]): frequency pairs turned by the temporal, height and width positions; they sum
            to ``embed_dim // num_heads // 2``. Default (16, 24, 24).
        image_token_id (int): the image placeholder token. Default 151655 (``<|image_pad|>``).
        vision_embed_dim, vision_num_layers, vision_num_heads, vision_intermediate_dim,
            vision_full_attention_layers, vision_window_size, patch_size, temporal_patch_size, in_channels,
            vision_norm_eps, vision_rope_base: the vision transformer's, as ``embed_dim``, ``num_layers``, ... of
            :func:`qwen2_5_vl_vision_encoder`.
        spatial_merge_size (int): side of a merge block in patches (one image token per block). Default 2.
        decoder_trainable (bool): the language model's parameters train. Default True.
        encoder_trainable (bool): the vision transformer's parameters (not the merger's) train. Default False.
        fusion_trainable (bool): the patch merger's parameters train. Default True.

    Returns:
        Qwen2_5_VisionLanguageModel: the model; frozen parts have ``requires_grad=False``.

    Raises:
        ValueError: for inconsistent sizes.
    """
    return _qwen2_5_vl(**locals(), lora=None, fusion_lora=None, decoder_lora=None)


def _qwen2_5_vl(
    *,
    lora: LoRASpec | None,
    decoder_lora: LoRASpec | None,
    fusion_lora: LoRASpec | None,
    decoder_trainable: str | bool,
    encoder_trainable: str | bool,
    fusion_trainable: str | bool,
    image_token_id: int,
    mrope_section: Sequence[int],
    vision_embed_dim: int,
    vision_num_layers: int,
    vision_num_heads: int,
    vision_intermediate_dim: int,
    vision_full_attention_layers: Sequence[int],
    vision_window_size: int,
    patch_size: int,
    temporal_patch_size: int,
    spatial_merge_size: int,
    in_channels: int,
    vision_norm_eps: float,
    vision_rope_base: float,
    **text_dims: Any,
) -> Qwen2_5_VisionLanguageModel:
    encoder = _vision_encoder(
        out_dim=text_dims["embed_dim"],
        patch_size=patch_size,
        temporal_patch_size=temporal_patch_size,
        in_channels=in_channels,
        embed_dim=vision_embed_dim,
        num_layers=vision_num_layers,
        num_heads=vision_num_heads,
        intermediate_dim=vision_intermediate_dim,
        full_attention_layers=vision_full_attention_layers,
        window_size=vision_window_size,
        merge_size=spatial_merge_size,
        norm_eps=vision_norm_eps,
        rope_base=vision_rope_base,
        lora=lora,
        fusion_lora=fusion_lora,
    )
    decoder = _decoder(lora=decoder_lora, mrope_section=mrope_section, **text_dims)
    model = Qwen2_5_VisionLanguageModel(encoder=encoder, decoder=decoder, image_token_id=image_token_id)
    set_part_trainable(model.decoder, decoder_trainable)
    for name, module in model.encoder.named_children():
        if name != "merger":
            set_part_trainable(module, encoder_trainable)
    set_part_trainable(model.encoder.merger, fusion_trainable)
    return model


def lora_qwen2_5_vl(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    mrope_section: Sequence[int] = (16, 24, 24),
    image_token_id: int = IMAGE_TOKEN_ID,
    vision_embed_dim: int = 1280,
    vision_num_layers: int = 32,
    vision_num_heads: int = 16,
    vision_intermediate_dim: int = 3420,
    vision_full_attention_layers: Sequence[int] = (7, 15, 23, 31),
    vision_window_size: int = 112,
    patch_size: int = 14,
    temporal_patch_size: int = 2,
    spatial_merge_size: int = 2,
    in_channels: int = 3,
    vision_norm_eps: float = 1e-6,
    vision_rope_base: float = 10_000.0,
    decoder_trainable: Trainable = "lora",
    encoder_trainable: Trainable = "frozen",
    fusion_trainable: Trainable = "lora",
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Qwen2_5_VisionLanguageModel:
    """:func:`qwen2_5_vl` with LoRA (or DoRA, or QLoRA) layers where each part asks for them.

    Each of the language model (``decoder_trainable``), the vision transformer (``encoder_trainable``) and the
    patch merger (``fusion_trainable``) is ``"frozen"`` (plain layers, nothing trains), ``"lora"`` (adapters on the
    chosen projections; only they train) or ``"full"`` (plain layers, every parameter trains). In the vision
    transformer, ``lora_attn_modules`` and ``apply_lora_to_mlp`` choose the adapted projections as in the
    language model; the merger's two linear layers are adapted when it is ``"lora"``.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the language model's output projection (untied sizes only; only with
            ``decoder_trainable="lora"``). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout,
            norm_eps, rope_base, tie_word_embeddings, mrope_section, image_token_id, vision_embed_dim,
            vision_num_layers, vision_num_heads, vision_intermediate_dim, vision_full_attention_layers,
            vision_window_size, patch_size, temporal_patch_size, spatial_merge_size, in_channels, vision_norm_eps,
            vision_rope_base: as in :func:`qwen2_5_vl`.
        decoder_trainable (str): ``"frozen"``, ``"lora"`` or ``"full"``. Default ``"lora"``.
        encoder_trainable (str): ``"frozen"``, ``"lora"`` or ``"full"``. Default ``"frozen"``.
        fusion_trainable (str): ``"frozen"``, ``"lora"`` or ``"full"``. Default ``"lora"``.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        Qwen2_5_VisionLanguageModel: the model; parameters that do not train have ``requires_grad=False``.

    Raises:
        ValueError: for an unknown trainable choice or module in ``lora_attn_modules``, or LoRA on a tied output.
    """
    arguments = dict(locals())
    choices = {
        name: trainable_choice(name, arguments.pop(name))
        for name in ("decoder_trainable", "encoder_trainable", "fusion_trainable")
    }
    spec_names = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank", "lora_alpha")
    spec_names += ("lora_dropout", "use_dora", "quantize_base")
    spec = lora_spec(**{name: arguments.pop(name) for name in spec_names})
    if spec.apply_to_output and choices["decoder_trainable"] != "lora":
        raise ValueError(
            f"apply_lora_to_output=True adapts the language model, but decoder_trainable is "
            f"{choices['decoder_trainable']!r}; set decoder_trainable='lora' or apply_lora_to_output=False."
        )
    model = _qwen2_5_vl(
        **arguments,
        **choices,
        lora=spec if choices["encoder_trainable"] == "lora" else None,
        decoder_lora=spec if choices["decoder_trainable"] == "lora" else None,
        fusion_lora=spec if choices["fusion_trainable"] == "lora" else None,
    )
    # read by the LoRA recipes, which train and save adapters only (tune.training.prepare_lora_model)
    model.trainable_parts = {name.removesuffix("_trainable"): choice for name, choice in choices.items()}
    return model
