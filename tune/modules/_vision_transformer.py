"""A CLIP-style vision transformer over tiled images (Radford et al., 2021, https://arxiv.org/abs/2103.00020), as
Llama 3.2 Vision uses it.

A large image is cut into up to ``max_num_tiles`` square tiles (an ``h x w`` grid: its aspect ratio); each tile is
cut into patches, and a class token is put in front of each tile's patch vectors. Position embeddings come in
two kinds: per token within a tile, and per tile (which depend on the aspect ratio); the modules computing them
are given by the builder (``tune.models.clip``). The encoder layers see the tokens of all tiles of an image as one
sequence, so tiles attend to each other.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules._layer_norm import Fp32LayerNorm


class VisionTransformer(nn.Module):
    """Patch embedding, class token, position embeddings and encoder layers over tiled images.

    ``forward`` returns the final tokens and, for each index in ``out_indices``, the tokens entering that layer
    (``out_indices=[0, 3]``: the input of the first and of the fourth layer), which Llama 3.2 Vision concatenates
    with the final tokens.

    Two additions for Llama 3.2 Vision (Meta's reference implementation and transformers' ``MllamaVisionModel``):
    ``global_layers`` run after ``post_tile_pos_embed``; and with ``pad_to_multiple_of > 1`` each tile's tokens are
    padded with zeros to a multiple of it before the layers and the padding removed from the outputs. Padded tokens
    and padded tiles (beyond ``h * w``) then get an attention mask under which they attend only real tokens while
    real tokens attend everything, as there.

    Args:
        patch_size (int): side of a square patch in pixels; must divide ``tile_size``.
        tile_size (int): side of a square tile in pixels.
        num_layers (int): number of copies of ``layer``.
        embed_dim (int): token width.
        layer (nn.Module | list[nn.Module]): an encoder layer (copied ``num_layers`` times) or the list of layers;
            called as ``layer(x, mask=mask)`` on [n, s, embed_dim].
        token_pos_embedding (nn.Module): ``(x [n, tiles, tokens, dim], aspect_ratio [n, 2]) -> same shape``.
        pre_tile_pos_embed (nn.Module | None): tile position embedding added before the class token. Default None.
        post_tile_pos_embed (nn.Module | None): tile position embedding added after the layers. Default None.
        cls_projection (nn.Module | None): applied to the output tokens [b, imgs, tiles, tokens, dim]
            (CLIP's projection of the class token). Default None.
        out_indices (list[int] | None): layers whose input is returned too. Default None.
        in_channels (int): image channels. Default 3.
        append_cls_token (bool): put the class token after the patches instead of before. Default False.
        global_layers (nn.ModuleList | list[nn.Module] | None): layers run after ``post_tile_pos_embed``.
            Default None.
        pad_to_multiple_of (int): pad each tile's tokens to a multiple of this. Default 1 (no padding).

    Raises:
        ValueError: if ``patch_size`` does not divide ``tile_size``, or an ``out_indices`` entry names no layer.
    """

    def __init__(
        self,
        patch_size: int,
        tile_size: int,
        num_layers: int,
        embed_dim: int,
        layer: nn.Module | list[nn.Module],
        token_pos_embedding: nn.Module,
        pre_tile_pos_embed: nn.Module | None = None,
        post_tile_pos_embed: nn.Module | None = None,
        cls_projection: nn.Module | None = None,
        out_indices: list[int] | None = None,
        in_channels: int = 3,
        append_cls_token: bool = False,
        *,
        global_layers: nn.ModuleList | list[nn.Module] | None = None,
        pad_to_multiple_of: int = 1,
    ) -> None:
        super().__init__()
        if tile_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide tile_size ({tile_size}).")
        out_indices = list(out_indices or [])
        if any(not 0 <= index < num_layers for index in out_indices):
            raise ValueError(f"out_indices {out_indices} must be layer indices in [0, {num_layers}).")
        self.patch_size = patch_size
        self.tile_size = tile_size
        self.embed_dim = embed_dim
        self.patches_per_tile = (tile_size // patch_size) ** 2
        self.num_tokens_per_tile = self.patches_per_tile + 1  # with the class token
        self.out_indices = out_indices
        self.append_cls_token = append_cls_token
        self.pad_to_multiple_of = pad_to_multiple_of
        # stride = kernel: each output pixel is one patch's linear projection
        self.conv = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size, bias=False)
        self.cls_token_embedding = nn.Parameter(torch.randn(embed_dim) * embed_dim**-0.5)
        self.token_pos_embedding = token_pos_embedding
        self.pre_tile_pos_embed = pre_tile_pos_embed
        self.post_tile_pos_embed = post_tile_pos_embed
        self.ln_pre = Fp32LayerNorm(embed_dim)
        self.ln_post = Fp32LayerNorm(embed_dim)
        if isinstance(layer, (list, nn.ModuleList)):
            self.layers = nn.ModuleList(layer)
        else:
            self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.global_layers = nn.ModuleList(global_layers or [])
        self.cls_projection = cls_projection

    def forward(
        self, images: torch.Tensor, aspect_ratio: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Encodes tiled images.

        Args:
            images (torch.Tensor): [b, num_images, num_tiles, in_channels, tile_size, tile_size]; tiles of an image
                in row-major order, padded tiles (and padded images) zero.
            aspect_ratio (torch.Tensor | None): [b, num_images, 2] int64, each image's tile grid (tiles high, tiles
                wide); None for one tile each.

        Returns:
            tuple[torch.Tensor, list[torch.Tensor]]: the output tokens [b, num_images, num_tiles, tokens, embed_dim]
            (``tokens = patches_per_tile + 1``), and one such tensor per ``out_indices`` entry.

        Raises:
            ValueError: for images that are not 6-D or not ``tile_size`` square.
        """
        if images.dim() != 6 or images.shape[-1] != self.tile_size or images.shape[-2] != self.tile_size:
            raise ValueError(
                "images must be [batch, num_images, num_tiles, channels, tile_size, tile_size] with tile_size "
                f"{self.tile_size}, got shape {tuple(images.shape)}."
            )
        batch_size, num_images, num_tiles, channels, _, _ = images.shape
        n = batch_size * num_images
        if aspect_ratio is None:
            aspect_ratio = torch.ones(n, 2, dtype=torch.long, device=images.device)
        aspect_ratio = aspect_ratio.reshape(n, 2)
        # patches: [n * tiles, dim, grid, grid] -> [n, tiles, patches, dim]
        # the image transform gives float32 tiles; the encoder may run in bf16
        tiles = images.reshape(n * num_tiles, channels, self.tile_size, self.tile_size).to(self.conv.weight.dtype)
        x = self.conv(tiles)
        x = x.flatten(2).transpose(1, 2).reshape(n, num_tiles, self.patches_per_tile, self.embed_dim)
        if self.pre_tile_pos_embed is not None:
            x = self.pre_tile_pos_embed(x, aspect_ratio)
        cls = self.cls_token_embedding.to(x.dtype).expand(n, num_tiles, 1, self.embed_dim)
        x = torch.cat([x, cls] if self.append_cls_token else [cls, x], dim=2)  # [n, tiles, tokens, dim]
        x = self.token_pos_embedding(x, aspect_ratio)
        x = self.ln_pre(x)
        num_tokens = self.num_tokens_per_tile
        padded = -(-num_tokens // self.pad_to_multiple_of) * self.pad_to_multiple_of
        x = F.pad(x, (0, 0, 0, padded - num_tokens))
        mask = self._padding_mask(aspect_ratio, num_tiles, padded)  # [n, s, s] or None
        x = x.reshape(n, num_tiles * padded, self.embed_dim)
        hidden_states = []
        for index, layer in enumerate(self.layers):
            if index in self.out_indices:
                hidden_states.append(x)
            x = layer(x, mask=mask)
        x = self.ln_post(x)
        if self.post_tile_pos_embed is not None:
            x = self.post_tile_pos_embed(x.reshape(n, num_tiles, padded, self.embed_dim), aspect_ratio)
            x = x.reshape(n, num_tiles * padded, self.embed_dim)
        for layer in self.global_layers:
            x = layer(x, mask=mask)

        def unpad(h: torch.Tensor) -> torch.Tensor:
            h = h.reshape(n, num_tiles, padded, -1)[:, :, :num_tokens]
            return h.reshape(batch_size, num_images, num_tiles, num_tokens, -1)

        x = unpad(x)
        if self.cls_projection is not None:
            x = self.cls_projection(x)
        return x, [unpad(h) for h in hidden_states]

    def _padding_mask(self, aspect_ratio: torch.Tensor, num_tiles: int, padded: int) -> torch.Tensor | None:
        """[n, tiles * padded, tiles * padded] bool: False only between two padding tokens; None without padding."""
        if padded == self.num_tokens_per_tile and num_tiles == 1:
            return None
        num_real_tiles = (aspect_ratio[:, 0] * aspect_ratio[:, 1]).clamp(1, num_tiles)  # tile 0 always counts
        device = aspect_ratio.device
        real_tile = torch.arange(num_tiles, device=device)[None, :, None] < num_real_tiles[:, None, None]
        real_token = torch.arange(padded, device=device)[None, None, :] < self.num_tokens_per_tile
        real = (real_tile & real_token).reshape(aspect_ratio.shape[0], num_tiles * padded)
        return real[:, :, None] | real[:, None, :]
