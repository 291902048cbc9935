"""SigLIP's vision transformer (Zhai et al., 2023, https://arxiv.org/abs/2303.15343), as Gemma 3 and PaliGemma use
it: no class token and no pooling head, one output vector per image patch.

An image is cut into non-overlapping ``patch_size`` squares (a strided convolution), each patch gets a learned
position embedding, and pre-norm encoder layers let every patch attend to every other one (no causal mask). The
layers are tune's ``TransformerSelfAttentionLayer`` and ``MultiHeadAttention`` with biased projections, LayerNorm
and an ungated tanh-GELU MLP, so adapters and activation checkpointing treat them like a decoder's layers.
"""

from collections.abc import Callable

import torch
from torch import nn

from tune.modules._attention import MultiHeadAttention
from tune.modules._transformer import TransformerSelfAttentionLayer


class VisionMLP(nn.Module):
    """``fc2(activation(fc1(x)))``: the vision transformer's ungated feed-forward block.

    Args:
        fc1 (nn.Module): embed_dim -> hidden_dim.
        fc2 (nn.Module): hidden_dim -> embed_dim.
        activation (nn.Module | None): between the two. Default tanh-approximated GELU (SigLIP's).
    """

    def __init__(self, *, fc1: nn.Module, fc2: nn.Module, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = fc1
        self.fc2 = fc2
        self.activation = activation if activation is not None else nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., embed_dim] -> [..., embed_dim]."""
        return self.fc2(self.activation(self.fc1(x)))


class SiglipVisionEncoder(nn.Module):
    """Patch embedding, learned position embeddings, encoder layers and a final LayerNorm.

    Args:
        image_size (int): side of the (square) input images, in pixels.
        patch_size (int): side of a patch; must divide ``image_size``.
        embed_dim (int): width of the patch vectors.
        layers (nn.ModuleList | list[nn.Module]): the encoder layers, [n, p, embed_dim] -> [n, p, embed_dim].
        norm (nn.Module): the final norm (SigLIP's ``post_layernorm``).
        in_channels (int): channels of the input images. Default 3.

    Raises:
        ValueError: if ``patch_size`` does not divide ``image_size``.
    """

    def __init__(
        self,
        *,
        image_size: int,
        patch_size: int,
        embed_dim: int,
        layers: nn.ModuleList | list[nn.Module],
        norm: nn.Module,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide image_size ({image_size}).")
        self.image_size = image_size
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.patches_per_side = image_size // patch_size
        self.num_patches = self.patches_per_side**2
        # stride = kernel: each output pixel is one patch's linear projection
        self.patch_embedding = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.position_embedding = nn.Embedding(self.num_patches, embed_dim)
        self.layers = layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(layers)
        self.norm = norm

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Encodes images.

        Args:
            pixel_values (torch.Tensor): [n_images, in_channels, image_size, image_size], normalised pixels.

        Returns:
            torch.Tensor: [n_images, num_patches, embed_dim], patches in row-major order.

        Raises:
            ValueError: for images of another size.
        """
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"pixel_values must be [n_images, channels, {self.image_size}, {self.image_size}], got shape "
                f"{tuple(pixel_values.shape)}; resize the images to the encoder's image_size."
            )
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))  # [n, d, side, side]
        h = patches.flatten(2).transpose(1, 2)  # [n, num_patches, d], row-major
        h = h + self.position_embedding.weight
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


def siglip_vision_encoder(
    *,
    image_size: int,
    patch_size: int,
    embed_dim: int,
    num_layers: int,
    num_heads: int,
    intermediate_dim: int,
    norm_eps: float = 1e-6,
    attn_dropout: float = 0.0,
    in_channels: int = 3,
    linear: Callable[[str, int, int], nn.Module] | None = None,
) -> SiglipVisionEncoder:
    """A SigLIP vision encoder of the given sizes, randomly initialised.

    Args:
        image_size (int): side of the input images in pixels (896 in Gemma 3).
        patch_size (int): side of a patch (14 in Gemma 3).
        embed_dim (int): width (1152 in Gemma 3).
        num_layers (int): encoder layers (27 in Gemma 3).
        num_heads (int): attention heads; must divide ``embed_dim``.
        intermediate_dim (int): MLP hidden width (4304 in Gemma 3).
        norm_eps (float): LayerNorm epsilon. Default 1e-6.
        attn_dropout (float): attention dropout. Default 0.0.
        in_channels (int): image channels. Default 3.
        linear (Callable[[str, int, int], nn.Module] | None): ``linear(name, in_dim, out_dim)`` makes each
            biased projection of a layer, named ``q_proj``, ``k_proj``, ``v_proj``, ``output_proj``, ``fc1`` or
            ``fc2``; a model builder passes one that returns LoRA layers where it wants adapters. Default None:
            ``nn.Linear(in_dim, out_dim)``.

    Returns:
        SiglipVisionEncoder: ``pixel_values`` [n, in_channels, image_size, image_size] -> [n, num_patches,
        embed_dim].

    Raises:
        ValueError: if ``num_heads`` does not divide ``embed_dim`` or ``patch_size`` does not divide
            ``image_size``.
    """
    if embed_dim % num_heads:
        raise ValueError(f"num_heads ({num_heads}) must divide embed_dim ({embed_dim}).")
    head_dim = embed_dim // num_heads
    if linear is None:

        def linear(name: str, in_dim: int, out_dim: int) -> nn.Module:
            return nn.Linear(in_dim, out_dim)

    layers = []
    for _ in range(num_layers):
        attn = MultiHeadAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_heads,
            head_dim=head_dim,
            q_proj=linear("q_proj", embed_dim, embed_dim),
            k_proj=linear("k_proj", embed_dim, embed_dim),
            v_proj=linear("v_proj", embed_dim, embed_dim),
            output_proj=linear("output_proj", embed_dim, embed_dim),
            is_causal=False,  # every patch sees every patch
            attn_dropout=attn_dropout,
        )
        mlp = VisionMLP(fc1=linear("fc1", embed_dim, intermediate_dim), fc2=linear("fc2", intermediate_dim, embed_dim))
        layers.append(
            TransformerSelfAttentionLayer(
                attn,
                mlp,
                sa_norm=nn.LayerNorm(embed_dim, eps=norm_eps),
                mlp_norm=nn.LayerNorm(embed_dim, eps=norm_eps),
            )
        )
    return SiglipVisionEncoder(
        image_size=image_size,
        patch_size=patch_size,
        embed_dim=embed_dim,
        layers=layers,
        norm=nn.LayerNorm(embed_dim, eps=norm_eps),
        in_channels=in_channels,
    )
