"""CLIP's vision transformer over tiled images, as a function of its dimensions (the encoder of Llama 3.2 Vision)."""

import copy
from collections.abc import Callable, Sequence

from torch import nn

from tune.models._common import LoRASpec
from tune.models.clip._position_embeddings import (
    TiledTokenPositionalEmbedding,
    TilePositionalEmbedding,
    TokenPositionalEmbedding,
)
from tune.modules import (
    FeedForward,
    Fp32LayerNorm,
    MultiHeadAttention,
    TanhGate,
    TransformerSelfAttentionLayer,
    VisionTransformer,
)
from tune.modules.peft import DoRALinear, LoRALinear


def clip_vision_encoder(
    tile_size: int,
    patch_size: int,
    embed_dim: int,
    num_layers: int,
    num_heads: int,
    activation: Callable[[], nn.Module] | nn.Module = nn.SiLU,
    cls_output_dim: int = 512,
    attn_bias: bool = True,
    use_rope: bool = False,
    out_indices: list[int] | None = None,
    output_cls_projection: bool = False,
    max_num_tiles: int = 4,
    in_channels: int = 3,
    append_cls_token: bool = False,
    use_tile_pos_embed: bool = True,
    *,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    num_global_layers: int = 0,
    supported_aspect_ratios: Sequence[tuple[int, int]] | None = None,
    pad_to_multiple_of: int = 1,
    lora: LoRASpec | None = None,
    global_lora: LoRASpec | None = None,
) -> VisionTransformer:
    """A CLIP vision transformer over images cut into up to ``max_num_tiles`` tiles.

    Each layer is pre-norm (LayerNorm) self-attention over all tokens of an image, without causal mask, and an
    ungated two-matrix MLP. With ``use_tile_pos_embed`` (or several tiles), per-tile position embeddings are added
    before the class token and after the layers, and token position embeddings depend on the tile grid.

    Args:
        tile_size (int): side of a tile in pixels (the image processor's tile size).
        patch_size (int): side of a patch in pixels; must divide ``tile_size``.
        embed_dim (int): token width.
        num_layers (int): encoder layers.
        num_heads (int): attention heads; must divide ``embed_dim``.
        activation (Callable[[], nn.Module] | nn.Module): the MLP activation, a module or its class. Default
            ``nn.SiLU`` (Llama 3.2 Vision passes ``nn.GELU``).
        cls_output_dim (int): width of the class-token projection; unused (see ``output_cls_projection``).
        attn_bias (bool): biases on the attention projections. Default True.
        use_rope (bool): rotary 2-D position embeddings (Llama 4); not supported, must be False.
        out_indices (list[int] | None): layers whose input is returned with the output. Default None.
        output_cls_projection (bool): return CLIP's projected class token only; not supported, must be False.
        max_num_tiles (int): the most tiles per image. Default 4.
        in_channels (int): image channels. Default 3.
        append_cls_token (bool): class token after the patches. Default False.
        use_tile_pos_embed (bool): per-tile position embeddings. Default True.
        intermediate_dim (int | None): MLP width. Default ``4 * embed_dim``.
        norm_eps (float): epsilon of the layers' LayerNorms. Default 1e-5.
        num_global_layers (int): layers after the post-tile embedding, with tanh-gated residual branches (Llama
            3.2 Vision's global encoder). Default 0.
        supported_aspect_ratios (Sequence[tuple[int, int]] | None): tile grids ``(h, w)`` with embeddings, in id
            order. Default: every grid of at most ``max_num_tiles`` tiles.
        pad_to_multiple_of (int): pad each tile's tokens to a multiple of this (8 in Llama 3.2 Vision). Default 1.
        lora (LoRASpec | None): adapters in the layers (``tune.models._common.lora_spec``). Default None.
        global_lora (LoRASpec | None): adapters in the global layers. Default None.

    Returns:
        VisionTransformer: the encoder, randomly initialised.

    Raises:
        ValueError: for ``use_rope`` or ``output_cls_projection``, or inconsistent sizes.
    """
    if use_rope or output_cls_projection:
        raise ValueError(
            "clip_vision_encoder: use_rope=True and output_cls_projection=True are not supported; the encoders "
            "tune builds (Llama 3.2 Vision's) use neither. Leave both False."
        )
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}).")
    layer_dims = dict(
        embed_dim=embed_dim,
        num_heads=num_heads,
        intermediate_dim=intermediate_dim or 4 * embed_dim,
        activation=activation,
        attn_bias=attn_bias,
        norm_eps=norm_eps,
    )
    layers = [_layer(**layer_dims, gated=False, lora=lora) for _ in range(num_layers)]
    global_layers = [_layer(**layer_dims, gated=True, lora=global_lora) for _ in range(num_global_layers)]
    tiled = use_tile_pos_embed or max_num_tiles > 1
    if tiled:
        token_pos = TiledTokenPositionalEmbedding(
            max_num_tiles, embed_dim, tile_size, patch_size, supported_aspect_ratios=supported_aspect_ratios
        )
        pre_tile = TilePositionalEmbedding(max_num_tiles, embed_dim, supported_aspect_ratios=supported_aspect_ratios)
        post_tile = TilePositionalEmbedding(max_num_tiles, embed_dim, supported_aspect_ratios=supported_aspect_ratios)
    else:
        token_pos = TokenPositionalEmbedding(embed_dim, tile_size, patch_size)
        pre_tile = post_tile = None
    return VisionTransformer(
        patch_size=patch_size,
        tile_size=tile_size,
        num_layers=num_layers,
        embed_dim=embed_dim,
        layer=layers,
        token_pos_embedding=token_pos,
        pre_tile_pos_embed=pre_tile,
        post_tile_pos_embed=post_tile,
        out_indices=out_indices,
        in_channels=in_channels,
        append_cls_token=append_cls_token,
        global_layers=global_layers,
        pad_to_multiple_of=pad_to_multiple_of,
    )


def _linear(in_dim: int, out_dim: int, *, bias: bool, lora: LoRASpec | None, adapted: bool) -> nn.Module:
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


def _layer(
    *,
    embed_dim: int,
    num_heads: int,
    intermediate_dim: int,
    activation: Callable[[], nn.Module] | nn.Module,
    attn_bias: bool,
    norm_eps: float,
    gated: bool,
    lora: LoRASpec | None,
) -> TransformerSelfAttentionLayer:
    targets = set(lora.attn_modules) if lora is not None else set()
    on_mlp = lora is not None and lora.apply_to_mlp
    attn = MultiHeadAttention(
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=embed_dim // num_heads,
        q_proj=_linear(embed_dim, embed_dim, bias=attn_bias, lora=lora, adapted="q_proj" in targets),
        k_proj=_linear(embed_dim, embed_dim, bias=attn_bias, lora=lora, adapted="k_proj" in targets),
        v_proj=_linear(embed_dim, embed_dim, bias=attn_bias, lora=lora, adapted="v_proj" in targets),
        output_proj=_linear(embed_dim, embed_dim, bias=attn_bias, lora=lora, adapted="output_proj" in targets),
        is_causal=False,
    )
    mlp = FeedForward(
        gate_proj=_linear(embed_dim, intermediate_dim, bias=True, lora=lora, adapted=on_mlp),
        down_proj=_linear(intermediate_dim, embed_dim, bias=True, lora=lora, adapted=on_mlp),
        up_proj=None,
        # a module of its own per layer, so hooks stay per layer
        activation=copy.deepcopy(activation) if isinstance(activation, nn.Module) else activation(),
    )
    return TransformerSelfAttentionLayer(
        attn,
        mlp,
        sa_norm=Fp32LayerNorm(embed_dim, eps=norm_eps),
        mlp_norm=Fp32LayerNorm(embed_dim, eps=norm_eps),
        sa_scale=TanhGate() if gated else None,
        mlp_scale=TanhGate() if gated else None,
    )
