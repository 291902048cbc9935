"""Llama 3.2 Vision component builders: the vision encoder (CLIP over image tiles and a projection into the language
model's width) and the language model with cross-attention fusion layers, as functions of their dimensions.

Architecture (Meta's reference implementation; transformers' ``MllamaForConditionalGeneration``): each image is
cut into up to 4 tiles of ``tile_size`` pixels; a 32-layer CLIP encodes the tokens of all tiles of an image
together (class token, tile and token position embeddings, tokens padded to a multiple of 8), 8 more "global"
layers with tanh-gated residual branches follow, and the final tokens are concatenated with the inputs of 5 of
the first 32 layers and projected linearly into the language model's width. The language model is Llama 3.1
with a cross-attention layer before every ``fusion_interval``-th layer and 8 new token embeddings
(``<|image|>`` and reserved tokens).

:func:`llama3_2_vision` and :func:`lora_llama3_2_vision` build the whole model from its dimensions (the released
sizes' builders call them with a row of ``MODEL_SIZES``).

"Fusion" parameters (trained or frozen together, ``tune.modules.model_fusion.get_fusion_params``) are, as in
torchtune: the global layers and the projection (torchtune's projection head), the cross-attention layers and the
new token embeddings.
"""

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import torch
from torch import nn

from tune.models._common import LoRASpec, build_decoder, llama_intermediate_dim, lora_spec, trainable_choice
from tune.models.clip import clip_vision_encoder
from tune.modules import (
    FeedForward,
    MultiHeadAttention,
    RMSNorm,
    TanhGate,
    TransformerCrossAttentionLayer,
    TransformerDecoder,
    VisionTransformer,
)
from tune.modules.model_fusion import DeepFusionModel, FusionEmbedding, FusionLayer, register_fusion_module
from tune.modules.peft import DoRALinear, LoRALinear, get_adapter_params

# Meta's encoder pads each tile's tokens to a multiple of this before its layers
_TOKEN_PADDING = 8


class Llama3VisionProjectionHead(nn.Module):
    """The encoder's output in the language model's width: the final tokens concatenated with the chosen
    intermediate ones (feature-interleaved, as in the checkpoints), then one linear projection.

    Args:
        output (nn.Module): ``clip_embed_dim * (num_hidden_inputs + 1)`` -> decoder embed_dim.
        num_hidden_inputs (int): number of intermediate token tensors. Default 0.
    """

    def __init__(self, output: nn.Module, num_hidden_inputs: int = 0) -> None:
        super().__init__()
        self.output = output
        self.num_hidden_inputs = num_hidden_inputs

    def forward(self, x: torch.Tensor, hidden_states: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Projects the encoder's tokens.

        Args:
            x (torch.Tensor): [b, num_images, num_tiles, tokens, clip_dim] final tokens.
            hidden_states (Sequence[torch.Tensor]): ``num_hidden_inputs`` tensors of the same shape.

        Returns:
            torch.Tensor: [b, num_images * num_tiles * tokens, decoder_dim].

        Raises:
            ValueError: if the number of intermediate tensors is not ``num_hidden_inputs``.
        """
        if len(hidden_states) != self.num_hidden_inputs:
            raise ValueError(f"Expected {self.num_hidden_inputs} intermediate token tensors, got {len(hidden_states)}.")
        if hidden_states:
            # [..., clip_dim, n] -> [..., clip_dim * n]: feature d of input k lands at d * n + k
            stacked = torch.stack(list(hidden_states), dim=-1)
            x = torch.cat([x, stacked.flatten(-2)], dim=-1)
        return self.output(x).flatten(1, -2)


class Llama3VisionEncoder(nn.Module):
    """CLIP over image tiles, then the projection head: images -> a sequence the language model cross-attends.

    Args:
        clip (VisionTransformer): the tiled vision transformer (with its global layers).
        projection_head (Llama3VisionProjectionHead): concatenation and projection.
    """

    def __init__(self, clip: VisionTransformer, projection_head: Llama3VisionProjectionHead) -> None:
        super().__init__()
        self.clip = clip
        self.projection = projection_head

    def forward(self, images: torch.Tensor, aspect_ratio: torch.Tensor | None = None) -> torch.Tensor:
        """Encodes a batch of tiled images.

        Args:
            images (torch.Tensor): [b, num_images, num_tiles, 3, tile_size, tile_size]; padded tiles and images zero.
            aspect_ratio (torch.Tensor | None): [b, num_images, 2] int64 tile grids (tiles high, tiles wide);
                padded images may have any grid (their outputs are masked by the cross-attention mask).

        Returns:
            torch.Tensor: [b, num_images * num_tiles * tokens_per_tile, decoder_dim].
        """
        x, hidden_states = self.clip(images, aspect_ratio)
        return self.projection(x, hidden_states)


def _linear(in_dim: int, out_dim: int, *, bias: bool, lora: LoRASpec | None, adapted: bool = True) -> nn.Module:
    if lora is None or not adapted:
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


def llama3_2_vision_encoder(
    *,
    patch_size: int,
    num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: list[int] | None,
    num_layers_projection: int,
    decoder_embed_dim: int,
    tile_size: int,
    max_num_tiles: int = 4,
    in_channels: int = 3,
    clip_intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    supported_aspect_ratios: Sequence[tuple[int, int]] | None = None,
) -> Llama3VisionEncoder:
    """Llama 3.2 Vision's image encoder.

    Args:
        patch_size (int): side of a patch in pixels (14).
        num_heads (int): attention heads of every encoder layer (16).
        clip_embed_dim (int): encoder width (1280).
        clip_num_layers (int): CLIP layers (32).
        clip_hidden_states (list[int] | None): CLIP layers whose input joins the output ([3, 7, 15, 23, 30]).
        num_layers_projection (int): gated global layers after CLIP (8).
        decoder_embed_dim (int): the language model's width.
        tile_size (int): side of a tile in pixels (560).
        max_num_tiles (int): the most tiles per image. Default 4.
        in_channels (int): image channels. Default 3.
        clip_intermediate_dim (int | None): encoder MLP width. Default ``4 * clip_embed_dim``.
        norm_eps (float): epsilon of the encoder layers' LayerNorms. Default 1e-5.
        supported_aspect_ratios (Sequence[tuple[int, int]] | None): tile grids with position embeddings, in id
            order. Default: every grid of at most ``max_num_tiles`` tiles.

    Returns:
        Llama3VisionEncoder: the encoder, randomly initialised.
    """
    return _encoder(**locals(), lora=None, global_lora=None, output_lora=None)


def lora_llama3_2_vision_encoder(
    encoder_lora: bool,
    fusion_lora: bool,
    lora_attn_modules: list[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    *,
    patch_size: int,
    num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: list[int] | None,
    num_layers_projection: int,
    decoder_embed_dim: int,
    tile_size: int,
    max_num_tiles: int = 4,
    in_channels: int = 3,
    lora_rank: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    clip_intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    supported_aspect_ratios: Sequence[tuple[int, int]] | None = None,
) -> Llama3VisionEncoder:
    """:func:`llama3_2_vision_encoder` with LoRA (or DoRA, QLoRA) adapters in the chosen parts.

    Args:
        encoder_lora (bool): adapters in the CLIP layers.
        fusion_lora (bool): adapters in the global layers, and (with ``apply_lora_to_output``) the projection.
        lora_attn_modules (list[str]): attention projections to adapt, from ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the MLPs too. Default False.
        apply_lora_to_output (bool): adapt the final projection (when ``fusion_lora``). Default False.
        patch_size, num_heads, clip_embed_dim, clip_num_layers, clip_hidden_states, num_layers_projection,
            decoder_embed_dim, tile_size, max_num_tiles, in_channels, clip_intermediate_dim, norm_eps,
            supported_aspect_ratios: as in :func:`llama3_2_vision_encoder`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator. Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        Llama3VisionEncoder: the encoder, randomly initialised.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``.
    """
    spec = lora_spec(
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
        quantize_base,
    )  # fmt: skip
    return _encoder(
        patch_size=patch_size,
        num_heads=num_heads,
        clip_embed_dim=clip_embed_dim,
        clip_num_layers=clip_num_layers,
        clip_hidden_states=clip_hidden_states,
        num_layers_projection=num_layers_projection,
        decoder_embed_dim=decoder_embed_dim,
        tile_size=tile_size,
        max_num_tiles=max_num_tiles,
        in_channels=in_channels,
        clip_intermediate_dim=clip_intermediate_dim,
        norm_eps=norm_eps,
        supported_aspect_ratios=supported_aspect_ratios,
        lora=spec if encoder_lora else None,
        global_lora=spec if fusion_lora else None,
        output_lora=spec if fusion_lora and apply_lora_to_output else None,
    )


def _encoder(
    *,
    patch_size: int,
    num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: list[int] | None,
    num_layers_projection: int,
    decoder_embed_dim: int,
    tile_size: int,
    max_num_tiles: int,
    in_channels: int,
    clip_intermediate_dim: int | None,
    norm_eps: float,
    supported_aspect_ratios: Sequence[tuple[int, int]] | None,
    lora: LoRASpec | None,
    global_lora: LoRASpec | None,
    output_lora: LoRASpec | None,
) -> Llama3VisionEncoder:
    clip = clip_vision_encoder(
        tile_size=tile_size,
        patch_size=patch_size,
        embed_dim=clip_embed_dim,
        num_layers=clip_num_layers,
        num_heads=num_heads,
        activation=nn.GELU,
        attn_bias=False,
        out_indices=clip_hidden_states,
        max_num_tiles=max_num_tiles,
        in_channels=in_channels,
        intermediate_dim=clip_intermediate_dim,
        norm_eps=norm_eps,
        num_global_layers=num_layers_projection,
        supported_aspect_ratios=supported_aspect_ratios,
        pad_to_multiple_of=_TOKEN_PADDING,
        lora=lora,
        global_lora=global_lora,
    )
    num_hidden = len(clip_hidden_states or [])
    output = _linear(clip_embed_dim * (num_hidden + 1), decoder_embed_dim, bias=True, lora=output_lora)
    head = Llama3VisionProjectionHead(output, num_hidden_inputs=num_hidden)
    # torchtune's projection head holds the global layers: both are fusion parameters
    register_fusion_module(clip.global_layers)
    register_fusion_module(head)
    return Llama3VisionEncoder(clip, head)


def llama3_2_vision_decoder(
    *,
    vocab_size: int,
    num_layers: int,
    fusion_interval: int,
    num_special_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    encoder_max_seq_len: int,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 8.0,
) -> TransformerDecoder:
    """Llama 3.2 Vision's language model: Llama 3.1 with a cross-attention layer before every
    ``fusion_interval``-th layer and ``num_special_tokens`` new token embeddings.

    Args:
        vocab_size (int): pretrained tokens (128256); the embedding has ``num_special_tokens`` rows more.
        num_layers (int): self-attention layers (32 for 11B, 80 for 90B).
        fusion_interval (int): a fusion layer before layers ``fusion_interval - 1``, ``2 * fusion_interval - 1``,
            ... (4).
        num_special_tokens (int): new token embeddings (8: ``<|image|>`` and reserved tokens).
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table, KV-cache default).
        encoder_max_seq_len (int): longest encoder sequence the cross-attention expects (recorded on it).
        rope_base (float): RoPE theta. Default 500000.
        intermediate_dim (int | None): feed-forward width. Default ``llama_intermediate_dim(embed_dim)``.
        norm_eps (float): RMSNorm epsilon. Default 1e-5.
        scale_factor (float): Llama 3.1 RoPE scaling factor. Default 8.

    Returns:
        TransformerDecoder: the decoder, randomly initialised; its fusion layers take ``encoder_input``.
    """
    return _decoder(**locals(), lora=None, fusion_lora=None)


def lora_llama3_2_vision_decoder(
    decoder_lora: bool,
    fusion_lora: bool,
    lora_attn_modules: list[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    *,
    vocab_size: int,
    num_layers: int,
    fusion_interval: int,
    num_special_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    encoder_max_seq_len: int,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    lora_rank: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    norm_eps: float = 1e-5,
    scale_factor: float = 8.0,
) -> TransformerDecoder:
    """:func:`llama3_2_vision_decoder` with LoRA (or DoRA, QLoRA) adapters in the chosen parts.

    Args:
        decoder_lora (bool): adapters in the self-attention layers (and the output, with ``apply_lora_to_output``).
        fusion_lora (bool): adapters in the cross-attention layers.
        lora_attn_modules (list[str]): attention projections to adapt, from ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward layers too. Default False.
        apply_lora_to_output (bool): adapt the output projection (when ``decoder_lora``). Default False.
        vocab_size, num_layers, fusion_interval, num_special_tokens, num_heads, num_kv_heads, embed_dim,
            max_seq_len, encoder_max_seq_len, rope_base, intermediate_dim, norm_eps, scale_factor: as in
            :func:`llama3_2_vision_decoder`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator. Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        TransformerDecoder: the decoder, randomly initialised.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``.
    """
    spec = lora_spec(
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
        quantize_base,
    )  # fmt: skip
    return _decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        fusion_interval=fusion_interval,
        num_special_tokens=num_special_tokens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        max_seq_len=max_seq_len,
        encoder_max_seq_len=encoder_max_seq_len,
        rope_base=rope_base,
        intermediate_dim=intermediate_dim,
        norm_eps=norm_eps,
        scale_factor=scale_factor,
        lora=spec if decoder_lora else None,
        fusion_lora=spec if fusion_lora else None,
    )


def _decoder(
    *,
    vocab_size: int,
    num_layers: int,
    fusion_interval: int,
    num_special_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    encoder_max_seq_len: int,
    rope_base: float,
    intermediate_dim: int | None,
    norm_eps: float,
    scale_factor: float,
    lora: LoRASpec | None,
    fusion_lora: LoRASpec | None,
) -> TransformerDecoder:
    if fusion_interval < 1:
        raise ValueError(f"fusion_interval must be a positive number of layers, got {fusion_interval}.")
    intermediate_dim = intermediate_dim or llama_intermediate_dim(embed_dim)
    decoder = build_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        norm_eps=norm_eps,
        rope_base=rope_base,
        rope_scaling=dict(scale_factor=scale_factor),
        lora=lora,
    )
    decoder.tok_embeddings = FusionEmbedding(vocab_size, num_special_tokens, embed_dim)
    head_dim = embed_dim // num_heads
    for index in range(fusion_interval - 1, num_layers, fusion_interval):
        cross = _cross_attention_layer(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_dim=intermediate_dim,
            encoder_max_seq_len=encoder_max_seq_len,
            norm_eps=norm_eps,
            lora=fusion_lora,
        )
        decoder.layers[index] = FusionLayer(decoder.layers[index], cross, fusion_first=True)
    return decoder


def _cross_attention_layer(
    *,
    embed_dim: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_dim: int,
    encoder_max_seq_len: int,
    norm_eps: float,
    lora: LoRASpec | None,
) -> TransformerCrossAttentionLayer:
    targets = set(lora.attn_modules) if lora is not None else set()
    on_mlp = lora is not None and lora.apply_to_mlp
    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    attn = MultiHeadAttention(
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_proj=_linear(embed_dim, q_dim, bias=False, lora=lora, adapted="q_proj" in targets),
        k_proj=_linear(embed_dim, kv_dim, bias=False, lora=lora, adapted="k_proj" in targets),
        v_proj=_linear(embed_dim, kv_dim, bias=False, lora=lora, adapted="v_proj" in targets),
        output_proj=_linear(q_dim, embed_dim, bias=False, lora=lora, adapted="output_proj" in targets),
        # keys are RMS-normalised per head, queries too (Mllama's q_norm / k_norm); no position embedding
        q_norm=RMSNorm(head_dim, eps=norm_eps),
        k_norm=RMSNorm(head_dim, eps=norm_eps),
        max_seq_len=encoder_max_seq_len,
        is_causal=False,
    )
    mlp = FeedForward(
        gate_proj=_linear(embed_dim, intermediate_dim, bias=False, lora=lora, adapted=on_mlp),
        down_proj=_linear(intermediate_dim, embed_dim, bias=False, lora=lora, adapted=on_mlp),
        up_proj=_linear(embed_dim, intermediate_dim, bias=False, lora=lora, adapted=on_mlp),
        activation=nn.SiLU(),
    )
    return TransformerCrossAttentionLayer(
        attn,
        mlp,
        ca_norm=RMSNorm(embed_dim, eps=norm_eps),
        mlp_norm=RMSNorm(embed_dim, eps=norm_eps),
        ca_scale=TanhGate(),
        mlp_scale=TanhGate(),
    )


class LoRATrainable(Enum):
    """How a part of a LoRA vision-language model trains (torchtune's ``LoRATrainable``)."""

    FULL = "full"
    LORA = "lora"
    FROZEN = "frozen"


def _trainable(value: str, name: str) -> LoRATrainable:
    return LoRATrainable(trainable_choice(name, value))


def _encoder_args(
    *,
    patch_size: int,
    vision_num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: Sequence[int] | None,
    num_layers_projection: int,
    max_num_tiles: int,
    image_size: int,
    embed_dim: int,
) -> dict[str, Any]:
    """The model's vision settings -> keyword arguments of :func:`llama3_2_vision_encoder`."""
    return dict(
        patch_size=patch_size,
        num_heads=vision_num_heads,
        clip_embed_dim=clip_embed_dim,
        clip_num_layers=clip_num_layers,
        clip_hidden_states=list(clip_hidden_states) if clip_hidden_states is not None else None,
        num_layers_projection=num_layers_projection,
        max_num_tiles=max_num_tiles,
        tile_size=image_size,
        decoder_embed_dim=embed_dim,
    )


def llama3_2_vision(
    *,
    vocab_size: int,
    num_layers: int,
    fusion_interval: int,
    num_special_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    encoder_max_seq_len: int,
    patch_size: int,
    vision_num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: Sequence[int] | None,
    num_layers_projection: int,
    max_num_tiles: int = 4,
    image_size: int = 560,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 8.0,
    decoder_trainable: bool = False,
    encoder_trainable: bool = True,
    fusion_trainable: bool = True,
) -> DeepFusionModel:
    """Llama 3.2 Vision of any size: the encoder and the language model joined by :class:`DeepFusionModel`.

    The released sizes (``llama3_2_vision_11b``, ``llama3_2_vision_90b``) call this with a row of ``MODEL_SIZES``.

    Args:
        vocab_size, num_layers, fusion_interval, num_special_tokens, num_heads, num_kv_heads, embed_dim,
            max_seq_len, encoder_max_seq_len, rope_base, intermediate_dim, norm_eps, scale_factor: the language
            model's, as in :func:`llama3_2_vision_decoder`.
        patch_size (int): side of an image patch in pixels (14).
        vision_num_heads (int): attention heads of the encoder layers (16).
        clip_embed_dim (int): encoder width (1280).
        clip_num_layers (int): CLIP layers (32).
        clip_hidden_states (Sequence[int] | None): CLIP layers whose input joins the encoder's output.
        num_layers_projection (int): gated global layers after CLIP (8).
        max_num_tiles (int): the most tiles per image. Default 4.
        image_size (int): tile size in pixels (the image transform's). Default 560.
        decoder_trainable (bool): train the language model's own weights. Default False.
        encoder_trainable (bool): train the CLIP encoder's weights. Default True.
        fusion_trainable (bool): train the fusion weights (global layers, projection, cross-attention layers, new
            token embeddings). Default True.

    Returns:
        DeepFusionModel: the model, randomly initialised.
    """
    encoder = _encoder_args(
        patch_size=patch_size, vision_num_heads=vision_num_heads, clip_embed_dim=clip_embed_dim,
        clip_num_layers=clip_num_layers, clip_hidden_states=clip_hidden_states,
        num_layers_projection=num_layers_projection, max_num_tiles=max_num_tiles, image_size=image_size,
        embed_dim=embed_dim,
    )  # fmt: skip
    decoder = llama3_2_vision_decoder(
        vocab_size=vocab_size, num_layers=num_layers, fusion_interval=fusion_interval,
        num_special_tokens=num_special_tokens, num_heads=num_heads, num_kv_heads=num_kv_heads, embed_dim=embed_dim,
        max_seq_len=max_seq_len, encoder_max_seq_len=encoder_max_seq_len, rope_base=rope_base,
        intermediate_dim=intermediate_dim, norm_eps=norm_eps, scale_factor=scale_factor,
    )  # fmt: skip
    return DeepFusionModel(
        decoder=decoder,
        encoder=llama3_2_vision_encoder(**encoder),
        decoder_trainable=decoder_trainable,
        encoder_trainable=encoder_trainable,
        fusion_trainable=fusion_trainable,
    )


def lora_llama3_2_vision(
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
    *,
    vocab_size: int,
    num_layers: int,
    fusion_interval: int,
    num_special_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    encoder_max_seq_len: int,
    patch_size: int,
    vision_num_heads: int,
    clip_embed_dim: int,
    clip_num_layers: int,
    clip_hidden_states: Sequence[int] | None,
    num_layers_projection: int,
    max_num_tiles: int = 4,
    image_size: int = 560,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 8.0,
) -> DeepFusionModel:
    """:func:`llama3_2_vision` with LoRA adapters where a part is ``"lora"``.

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
        vocab_size, num_layers, fusion_interval, num_special_tokens, num_heads, num_kv_heads, embed_dim,
            max_seq_len, encoder_max_seq_len, patch_size, vision_num_heads, clip_embed_dim, clip_num_layers,
            clip_hidden_states, num_layers_projection, max_num_tiles, image_size, rope_base, intermediate_dim,
            norm_eps, scale_factor: as in :func:`llama3_2_vision`.

    Returns:
        DeepFusionModel: the model; its ``trainable_parts`` records the three choices.

    Raises:
        ValueError: for a part that is not ``"frozen"``, ``"lora"`` or ``"full"``, or an unknown attention module.
    """
    lora_args = dict(
        lora_attn_modules=lora_attn_modules, apply_lora_to_mlp=apply_lora_to_mlp,
        apply_lora_to_output=apply_lora_to_output, lora_rank=lora_rank, lora_alpha=lora_alpha,
        lora_dropout=lora_dropout, use_dora=use_dora, quantize_base=quantize_base,
    )  # fmt: skip
    encoder = _encoder_args(
        patch_size=patch_size, vision_num_heads=vision_num_heads, clip_embed_dim=clip_embed_dim,
        clip_num_layers=clip_num_layers, clip_hidden_states=clip_hidden_states,
        num_layers_projection=num_layers_projection, max_num_tiles=max_num_tiles, image_size=image_size,
        embed_dim=embed_dim,
    )  # fmt: skip
    decoder = dict(
        vocab_size=vocab_size, num_layers=num_layers, fusion_interval=fusion_interval,
        num_special_tokens=num_special_tokens, num_heads=num_heads, num_kv_heads=num_kv_heads, embed_dim=embed_dim,
        max_seq_len=max_seq_len, encoder_max_seq_len=encoder_max_seq_len, rope_base=rope_base,
        intermediate_dim=intermediate_dim, norm_eps=norm_eps, scale_factor=scale_factor,
    )  # fmt: skip
    parts = dict(decoder=decoder_trainable, encoder=encoder_trainable, fusion=fusion_trainable)
    return _lora_fusion_model(encoder, decoder, parts, lora_args)


def _lora_fusion_model(
    encoder_args: Mapping[str, Any],
    decoder_args: Mapping[str, Any],
    parts: Mapping[str, str],
    lora_args: Mapping[str, Any],
) -> DeepFusionModel:
    """Llama 3.2 Vision with LoRA where ``parts`` asks for it (what :func:`lora_llama3_2_vision` and the reader of a
    ``config.json`` build).

    Args:
        encoder_args (Mapping[str, Any]): :func:`lora_llama3_2_vision_encoder`'s dimension arguments.
        decoder_args (Mapping[str, Any]): :func:`lora_llama3_2_vision_decoder`'s dimension arguments.
        parts (Mapping[str, str]): ``decoder``, ``encoder``, ``fusion`` -> ``"frozen"``, ``"lora"`` or ``"full"``.
        lora_args (Mapping[str, Any]): ``lora_attn_modules``, ``apply_lora_to_mlp``, ... as the LoRA builders take.

    Returns:
        DeepFusionModel: the model; its ``trainable_parts`` records the three choices.

    Raises:
        ValueError: for a part that is not ``"frozen"``, ``"lora"`` or ``"full"``, or an unknown attention module.
    """
    decoder_type = _trainable(parts["decoder"], "decoder_trainable")
    encoder_type = _trainable(parts["encoder"], "encoder_trainable")
    fusion_type = _trainable(parts["fusion"], "fusion_trainable")
    fusion_lora = fusion_type is LoRATrainable.LORA
    decoder = lora_llama3_2_vision_decoder(decoder_type is LoRATrainable.LORA, fusion_lora, **lora_args, **decoder_args)
    encoder = lora_llama3_2_vision_encoder(encoder_type is LoRATrainable.LORA, fusion_lora, **lora_args, **encoder_args)
    model = DeepFusionModel(
        decoder=decoder,
        encoder=encoder,
        decoder_trainable=decoder_type is LoRATrainable.FULL,
        encoder_trainable=encoder_type is LoRATrainable.FULL,
        fusion_trainable=fusion_type is LoRATrainable.FULL,
    )
    # "lora" parts train their adapters only (the base weights stay frozen, as set above)
    for param in get_adapter_params(model).values():
        param.requires_grad_(True)
    # read by the LoRA recipes, which train and save adapters only (tune.training.prepare_lora_model)
    model.trainable_parts = {"decoder": decoder_type.value, "encoder": encoder_type.value, "fusion": fusion_type.value}
    return model
