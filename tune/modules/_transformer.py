"""The decoder-only transformer and its self-attention layer."""

import copy

import torch
from torch import nn

from tune.modules._attention import MultiHeadAttention
from tune.modules._flex_attention import block_mask, flex_attention_supported


class TransformerSelfAttentionLayer(nn.Module):
    """A pre-norm transformer block: ``h = x + sa_scale(attn(sa_norm(x)))``, ``out = h + mlp_scale(mlp(mlp_norm(h)))``.

    Args:
        attn (MultiHeadAttention): the self-attention.
        mlp (nn.Module): the feed-forward block.
        sa_norm (nn.Module | None): norm before attention. Default: identity.
        mlp_norm (nn.Module | None): norm before the feed-forward block. Default: identity.
        sa_scale (nn.Module | None): applied to the attention output before the residual add (Gemma 2's
            post-attention norm). Default: identity.
        mlp_scale (nn.Module | None): applied to the feed-forward output before the residual add (Gemma 2's
            post-feed-forward norm). Default: identity.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        *,
        sa_norm: nn.Module | None = None,
        mlp_norm: nn.Module | None = None,
        sa_scale: nn.Module | None = None,
        mlp_scale: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.sa_norm = sa_norm if sa_norm is not None else nn.Identity()
        self.mlp_norm = mlp_norm if mlp_norm is not None else nn.Identity()
        self.sa_scale = sa_scale if sa_scale is not None else nn.Identity()
        self.mlp_scale = mlp_scale if mlp_scale is not None else nn.Identity()

    def setup_cache(self, batch_size: int, dtype: torch.dtype, *, decoder_max_seq_len: int) -> None:
        """Allocates the attention's KV cache."""
        self.attn.setup_cache(batch_size, dtype, decoder_max_seq_len)

    def caches_are_setup(self) -> bool:
        """Whether the attention has a KV cache."""
        return self.attn.kv_cache is not None

    def caches_are_enabled(self) -> bool:
        """Whether the attention has a KV cache and uses it (see ``tune.modules.disable_kv_cache``)."""
        return self.attn.kv_cache is not None and self.attn.cache_enabled

    def reset_cache(self) -> None:
        """Empties the attention's KV cache."""
        self.attn.reset_cache()

    def forward(
        self, x: torch.Tensor, *, mask: torch.Tensor | None = None, input_pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[b, s, embed_dim] -> [b, s, embed_dim]; ``mask`` and ``input_pos`` as in MultiHeadAttention."""
        h = x + self.sa_scale(self.attn(self.sa_norm(x), mask=mask, input_pos=input_pos))
        return h + self.mlp_scale(self.mlp(self.mlp_norm(h)))


class TransformerDecoder(nn.Module):
    """Token embedding, a stack of layers, a final norm and an output projection to vocabulary logits.

    Set ``skip_output_layer = True`` to get the final normed hidden states instead of logits (a chunked loss then
    applies ``model.output`` itself, chunk by chunk, without materialising all logits).

    Args:
        tok_embeddings (nn.Embedding): vocab_size -> embed_dim.
        layers (nn.ModuleList | list[nn.Module] | nn.Module): the transformer layers, or one layer to copy
            ``num_layers`` times.
        max_seq_len (int): the longest sequence the model supports (and the default KV-cache capacity).
        num_heads (int): query heads per layer (recorded for tools such as generation).
        head_dim (int): features per head.
        norm (nn.Module): the final norm.
        output (nn.Module): embed_dim -> vocab_size (``nn.Linear``, ``TiedLinear`` or a LoRA layer).
        num_layers (int | None): with a single layer module as ``layers``, the number of deep copies to stack;
            None when ``layers`` is already the list of layers. Default None.
        output_hidden_states (list[int] | None): indices of layers whose INPUT hidden state ``[b, s, embed_dim]``
            is also returned: ``forward`` then returns ``[*hidden_states, output]``. Default None (output only).
        embed_scale (float | None): multiplies the embeddings (Gemma uses ``sqrt(embed_dim)``, rounded to the
            activation dtype as Hugging Face does). None for no scaling.

    Raises:
        ValueError: if ``num_layers`` is given with a list of layers, or missing with a single layer.
    """

    def __init__(
        self,
        *,
        tok_embeddings: nn.Embedding,
        layers: nn.ModuleList | list[nn.Module] | nn.Module,
        max_seq_len: int,
        num_heads: int,
        head_dim: int,
        norm: nn.Module,
        output: nn.Module,
        num_layers: int | None = None,
        output_hidden_states: list[int] | None = None,
        embed_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.tok_embeddings = tok_embeddings
        self.layers = _stack_layers(layers, num_layers)
        self.output_hidden_states = list(output_hidden_states or [])
        self.norm = norm
        self.output = output
        self.max_seq_len = max_seq_len
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.embed_scale = embed_scale
        self.skip_output_layer = False
        # packed batches on a GPU attend through flex attention (tune.modules._flex_attention); False: dense SDPA
        self.use_flex_attention = True
        # > 0: forward returns the logits as that many chunks along the sequence (torchtune's convention)
        self.num_output_chunks = 0

    def set_num_output_chunks(self, num_output_chunks: int) -> None:
        """Makes ``forward`` return the logits as a list of ``num_output_chunks`` chunks along the sequence.

        This is how torchtune's recipes feed ``CEWithChunkedOutputLoss``; tune's recipes instead let the loss apply
        the output layer (``skip_output_layer``, see ``LinearCrossEntropyLoss``). 0 returns one tensor again.

        Args:
            num_output_chunks (int): number of chunks, or 0 for one tensor.
        """
        self.num_output_chunks = num_output_chunks

    def setup_caches(self, batch_size: int, dtype: torch.dtype, decoder_max_seq_len: int | None = None) -> None:
        """Allocates a KV cache in every layer for generation.

        Args:
            batch_size (int): rows generated at once.
            dtype (torch.dtype): cache dtype (usually the model's).
            decoder_max_seq_len (int | None): capacity in tokens (prompt + new tokens). Default ``max_seq_len``.
        """
        capacity = decoder_max_seq_len or self.max_seq_len
        for layer in self.layers:
            layer.setup_cache(batch_size, dtype, decoder_max_seq_len=capacity)

    def caches_are_setup(self) -> bool:
        """Whether KV caches are set up."""
        return self.layers[0].caches_are_setup()

    def caches_are_enabled(self) -> bool:
        """Whether KV caches are set up and in use (then every forward appends to them)."""
        return self.layers[0].caches_are_enabled()

    def reset_caches(self) -> None:
        """Empties every KV cache (before generating for a new batch).

        Raises:
            RuntimeError: if no caches are set up.
        """
        if not self.caches_are_enabled():
            raise RuntimeError("No KV caches to reset: call model.setup_caches(batch_size, dtype) first.")
        for layer in self.layers:
            layer.reset_cache()

    def delete_caches(self) -> None:
        """Removes the KV caches and frees their memory (back to training mode behaviour)."""
        for layer in self.layers:
            layer.attn.kv_cache = None
            layer.attn.cache_enabled = True

    def _flex_mask_applies(self, mask: torch.Tensor) -> bool:
        return (
            self.use_flex_attention
            and isinstance(mask, torch.Tensor)
            and mask.dim() == 3
            and mask.dtype == torch.bool
            and flex_attention_supported(mask.device)
            and all(_supports_block_mask(layer) for layer in self.layers)
        )

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The layers' input for ``tokens`` [b, s]: their embeddings [b, s, embed_dim], times ``embed_scale``."""
        h = self.tok_embeddings(tokens)
        if self.embed_scale is not None:
            h = h * torch.tensor(self.embed_scale, dtype=h.dtype)
        return h

    def forward(
        self,
        tokens: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Computes logits (or final hidden states when ``skip_output_layer``).

        Args:
            tokens (torch.Tensor | None): [b, s] int64 token ids; None when ``input_embeds`` is given.
            mask (torch.Tensor | None): [b, s, s_kv] bool, True where a query may attend a key (padding or packed
                documents); None for plain causal attention.
            input_pos (torch.Tensor | None): [b, s] int64 positions (per-document for packed sequences); None
                for ``0..s-1``.
            input_embeds (torch.Tensor | None): [b, s, embed_dim], the layers' input in place of ``embed(tokens)``
                (a vision-language model's token embeddings with image features put in). Default None.

        Returns:
            torch.Tensor | list[torch.Tensor]: [b, s, vocab_size] float32 logits (a list of sequence chunks after
            ``set_num_output_chunks``), or [b, s, embed_dim] hidden states; with ``output_hidden_states``, the list
            ``[*hidden_states, output]``.

        Raises:
            ValueError: if not exactly one of ``tokens`` and ``input_embeds`` is given, for a ``tokens`` that is not
                2-D or an ``input_embeds`` that is not 3-D, or a sequence longer than ``max_seq_len``.
        """
        if (tokens is None) == (input_embeds is None):
            raise ValueError("Pass exactly one of tokens and input_embeds.")
        if tokens is not None and tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq] token ids, got shape {tuple(tokens.shape)}.")
        if input_embeds is not None and input_embeds.dim() != 3:
            raise ValueError(f"input_embeds must be [batch, seq, embed_dim], got shape {tuple(input_embeds.shape)}.")
        seq_len = (tokens if tokens is not None else input_embeds).shape[1]
        if seq_len > self.max_seq_len:
            raise ValueError(
                f"Sequence length {seq_len} exceeds the model's max_seq_len {self.max_seq_len}; truncate "
                "the inputs (e.g. tokenizer.max_seq_len) or build the model with a larger max_seq_len."
            )
        h = self.embed(tokens) if input_embeds is None else input_embeds
        if mask is not None and self._flex_mask_applies(mask):
            mask = block_mask(mask)  # once for all layers
        hidden = []
        for i, layer in enumerate(self.layers):
            if i in self.output_hidden_states:
                hidden.append(h)  # the layer's input, as torchtune returns it
            h = layer(h, mask=mask, input_pos=input_pos)
        h = self.norm(h)
        if self.skip_output_layer:
            output = h
        elif self.num_output_chunks > 0:
            output = [self.output(chunk).float() for chunk in h.chunk(self.num_output_chunks, dim=1)]
        else:
            output = self.output(h).float()
        return [*hidden, output] if hidden else output


def _supports_block_mask(layer: nn.Module) -> bool:
    attn = getattr(layer, "attn", None)  # also through activation-checkpoint wrappers, which forward attributes
    return isinstance(attn, MultiHeadAttention) and attn.supports_block_mask()


def _stack_layers(layers: nn.Module | list[nn.Module], num_layers: int | None) -> nn.ModuleList:
    """The decoder's layers: the given list, or ``num_layers`` deep copies of one layer."""
    if isinstance(layers, (nn.ModuleList, list)):
        if num_layers is not None:
            raise ValueError(
                f"num_layers={num_layers} was given with a list of {len(layers)} layers; pass num_layers only "
                "with a single layer to copy."
            )
        return layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(layers)
    if num_layers is None:
        raise ValueError("layers is a single module: pass num_layers (how many copies to stack) or a list.")
    return nn.ModuleList(copy.deepcopy(layers) for _ in range(num_layers))
