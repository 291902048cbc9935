"""The pieces a deep-fusion decoder is made of: a decoder layer paired with a cross-attention layer, and a token
embedding with extra rows for new special tokens."""

import torch
from torch import nn


class FusionLayer(nn.Module):
    """A decoder layer with a fusion layer (``TransformerCrossAttentionLayer``) run before (or after) it.

    The pair takes the place of one layer of a pretrained decoder, so the decoder's own layers and their weights
    are untouched; ``fusion_layer``'s parameters are the fusion parameters (:func:`get_fusion_params`). Cache and
    ``attn`` requests go to the decoder layer: the fusion layer keeps no KV cache (``DeepFusionModel`` keeps the
    encoder's output during generation instead).

    Args:
        layer (nn.Module): the decoder layer (``TransformerSelfAttentionLayer``).
        fusion_layer (nn.Module): called as ``fusion_layer(x, encoder_input=..., encoder_mask=...)``.
        fusion_first (bool): run ``fusion_layer`` before ``layer`` (Llama 3.2 Vision). Default True.
    """

    def __init__(self, layer: nn.Module, fusion_layer: nn.Module, fusion_first: bool = True) -> None:
        super().__init__()
        self.layer = layer
        self.fusion_layer = fusion_layer
        self.fusion_first = fusion_first

    @property
    def attn(self) -> nn.Module:
        """The decoder layer's self-attention (what decoders and cache helpers look up on a layer)."""
        return self.layer.attn

    def setup_cache(
        self, batch_size: int, dtype: torch.dtype, *, decoder_max_seq_len: int, encoder_max_seq_len: int | None = None
    ) -> None:
        """Allocates the decoder layer's KV cache; ``encoder_max_seq_len`` is accepted for torchtune's signature."""
        self.layer.setup_cache(batch_size, dtype, decoder_max_seq_len=decoder_max_seq_len)

    def caches_are_setup(self) -> bool:
        """Whether the decoder layer has a KV cache."""
        return self.layer.caches_are_setup()

    def caches_are_enabled(self) -> bool:
        """Whether the decoder layer has a KV cache and uses it."""
        return self.layer.caches_are_enabled()

    def reset_cache(self) -> None:
        """Empties the decoder layer's KV cache."""
        self.layer.reset_cache()

    def fusion_params(self) -> list[str]:
        """Names (relative to this module) of the fusion layer's parameters."""
        return [f"fusion_layer.{name}" for name, _ in self.fusion_layer.named_parameters()]

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
        encoder_input: torch.Tensor | None = None,
        encoder_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[b, s, embed_dim] -> [b, s, embed_dim]; ``mask``/``input_pos`` go to the decoder layer,
        ``encoder_input``/``encoder_mask`` to the fusion layer."""
        if self.fusion_first:
            x = self.fusion_layer(x, encoder_input=encoder_input, encoder_mask=encoder_mask)
            return self.layer(x, mask=mask, input_pos=input_pos)
        x = self.layer(x, mask=mask, input_pos=input_pos)
        return self.fusion_layer(x, encoder_input=encoder_input, encoder_mask=encoder_mask)


class FusionEmbedding(nn.Module):
    """A token embedding of ``vocab_size`` pretrained rows plus ``fusion_vocab_size`` new ones.

    Token ids below ``vocab_size`` look up ``embedding``, the others ``fusion_embedding`` (id minus
    ``vocab_size``), so the new rows (Llama 3.2 Vision's ``<|image|>`` and reserved tokens) can train while the
    pretrained ones stay frozen; ``fusion_embedding`` holds the fusion parameters.

    Args:
        vocab_size (int): rows of the pretrained embedding.
        fusion_vocab_size (int): new rows.
        embed_dim (int): embedding width.
    """

    def __init__(self, vocab_size: int, fusion_vocab_size: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.fusion_embedding = nn.Embedding(fusion_vocab_size, embed_dim)
        self.vocab_size = vocab_size
        self.num_embeddings = vocab_size + fusion_vocab_size
        self.embedding_dim = embed_dim

    def fusion_params(self) -> list[str]:
        """Names (relative to this module) of the new rows' parameters."""
        return ["fusion_embedding.weight"]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] int64 token ids -> [..., embed_dim]."""
        is_base = tokens < self.vocab_size
        # both tables are looked up for every token (ids clamped into range) and the right row kept: no
        # data-dependent shapes, and each table gets gradient only from its own tokens
        base = self.embedding(tokens.clamp(max=self.vocab_size - 1))
        fusion = self.fusion_embedding((tokens - self.vocab_size).clamp(min=0))
        return torch.where(is_base[..., None], base, fusion)
