"""Position embeddings of a CLIP vision transformer over tiled images (``tune.modules.VisionTransformer``).

Per-tile embeddings depend on the image's tile grid (its aspect ratio, ``h x w`` tiles). They are stored as
Llama 3.2 Vision's checkpoints store them: one row per supported aspect ratio (row 0 for padding images), each
row holding a vector for every tile slot of ``max_num_tiles``, so a Hugging Face checkpoint loads and saves back
exactly. (torchtune stores one ``[max_tiles, max_tiles]`` grid shared by all ratios instead.)
"""

from collections.abc import Sequence

import torch
from torch import nn


def default_aspect_ratios(max_num_tiles: int) -> list[tuple[int, int]]:
    """Every tile grid ``(h, w)`` with ``h * w <= max_num_tiles``, in the order Mllama numbers them (its
    ``supported_aspect_ratios``: sorted by ``h``, then ``w``).

    Args:
        max_num_tiles (int): the most tiles an image may have.

    Returns:
        list[tuple[int, int]]: the grids; grid ``k`` has aspect-ratio id ``k + 1``.
    """
    return [(h, w) for h in range(1, max_num_tiles + 1) for w in range(1, max_num_tiles + 1) if h * w <= max_num_tiles]


def _aspect_ratio_ids(aspect_ratio: torch.Tensor, ratios: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[n, 2] (h, w) -> [n] int64 ids: 1 + the grid's index in ``ratios``, 0 for any other grid (padding)."""
    ids = torch.zeros(aspect_ratio.shape[0], dtype=torch.long, device=aspect_ratio.device)
    for index, (h, w) in enumerate(ratios):
        ids = ids + (index + 1) * ((aspect_ratio[:, 0] == h) & (aspect_ratio[:, 1] == w)).long()
    return ids


class TokenPositionalEmbedding(nn.Module):
    """A learned position embedding per token of a (single) tile: ``x + positional_embedding``.

    Args:
        embed_dim (int): token width.
        tile_size (int): side of a tile in pixels.
        patch_size (int): side of a patch in pixels.
    """

    def __init__(self, embed_dim: int, tile_size: int, patch_size: int) -> None:
        super().__init__()
        num_tokens = (tile_size // patch_size) ** 2 + 1
        self.positional_embedding = nn.Parameter(embed_dim**-0.5 * torch.randn(num_tokens, embed_dim))

    def forward(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        """[..., tokens, embed_dim] -> the same shape."""
        return x + self.positional_embedding.to(x.dtype)


class TiledTokenPositionalEmbedding(nn.Module):
    """Token position embeddings for tiled images, local and per tile, mixed by one tanh gate ``g``:
    ``x + (1 - tanh(g)) * local[token] + tanh(g) * global[aspect ratio, tile, token]``.

    Args:
        max_num_tiles (int): the most tiles an image may have.
        embed_dim (int): token width.
        tile_size (int): side of a tile in pixels.
        patch_size (int): side of a patch in pixels.
        supported_aspect_ratios (Sequence[tuple[int, int]] | None): the tile grids ``(h, w)`` with an
            embedding, in id order. Default :func:`default_aspect_ratios`.
    """

    def __init__(
        self,
        max_num_tiles: int,
        embed_dim: int,
        tile_size: int,
        patch_size: int,
        supported_aspect_ratios: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        super().__init__()
        self.max_num_tiles = max_num_tiles
        self.embed_dim = embed_dim
        self.num_tokens = (tile_size // patch_size) ** 2 + 1
        self.supported_aspect_ratios = [
            tuple(r) for r in supported_aspect_ratios or default_aspect_ratios(max_num_tiles)
        ]
        scale = embed_dim**-0.5
        self.local_token_positional_embedding = nn.Parameter(scale * torch.randn(self.num_tokens, embed_dim))
        self.global_token_positional_embedding = nn.Embedding(
            len(self.supported_aspect_ratios) + 1, max_num_tiles * self.num_tokens * embed_dim
        )
        nn.init.normal_(self.global_token_positional_embedding.weight, std=scale)
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, aspect_ratio: torch.Tensor) -> torch.Tensor:
        """Adds the embeddings.

        Args:
            x (torch.Tensor): [n, tiles, tokens, embed_dim], ``tiles <= max_num_tiles``.
            aspect_ratio (torch.Tensor): [n, 2] int64 tile grids (h, w).

        Returns:
            torch.Tensor: [n, tiles, tokens, embed_dim].
        """
        n, num_tiles = x.shape[:2]
        gate = self.gate.tanh().to(x.dtype)
        x = x + (1 - gate) * self.local_token_positional_embedding.to(x.dtype)
        table = self.global_token_positional_embedding(_aspect_ratio_ids(aspect_ratio, self.supported_aspect_ratios))
        table = table.reshape(n, self.max_num_tiles, self.num_tokens, self.embed_dim)[:, :num_tiles]
        return x + gate * table.to(x.dtype)


class TilePositionalEmbedding(nn.Module):
    """A gated position embedding per tile, shared by the tile's tokens: ``x + tanh(g) * table[aspect ratio, tile]``.

    Args:
        max_num_tiles (int): the most tiles an image may have.
        embed_dim (int): token width.
        supported_aspect_ratios (Sequence[tuple[int, int]] | None): the tile grids ``(h, w)`` with an
            embedding, in id order. Default :func:`default_aspect_ratios`.
    """

    def __init__(
        self, max_num_tiles: int, embed_dim: int, supported_aspect_ratios: Sequence[tuple[int, int]] | None = None
    ) -> None:
        super().__init__()
        self.max_num_tiles = max_num_tiles
        self.embed_dim = embed_dim
        self.supported_aspect_ratios = [
            tuple(r) for r in supported_aspect_ratios or default_aspect_ratios(max_num_tiles)
        ]
        self.embedding = nn.Embedding(len(self.supported_aspect_ratios) + 1, max_num_tiles * embed_dim)
        nn.init.normal_(self.embedding.weight, std=embed_dim**-0.5)
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, aspect_ratio: torch.Tensor) -> torch.Tensor:
        """Adds the embedding.

        Args:
            x (torch.Tensor): [n, tiles, tokens, embed_dim], ``tiles <= max_num_tiles``.
            aspect_ratio (torch.Tensor): [n, 2] int64 tile grids (h, w).

        Returns:
            torch.Tensor: [n, tiles, tokens, embed_dim].
        """
        n, num_tiles = x.shape[:2]
        table = self.embedding(_aspect_ratio_ids(aspect_ratio, self.supported_aspect_ratios))
        table = table.reshape(n, self.max_num_tiles, 1, self.embed_dim)[:, :num_tiles]
        return x + self.gate.tanh().to(x.dtype) * table.to(x.dtype)
