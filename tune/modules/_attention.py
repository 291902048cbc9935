"""Multi-head attention with grouped key/value heads (MHA, GQA and MQA in one module).

``MultiHeadAttention.forward`` reads as the computation: projections, RoPE, KV cache, scaled dot-product attention,
output projection. Context parallelism hands q, k, v to the ``ContextParallelMask`` given as the mask
(``_context_parallel``). Two faster routes for packed batches are kept apart, each with the same result: on CPU, a
block-causal mask attends one document at a time (``_packed_attention`` explains it, ``split_packed_documents =
False`` on a layer turns it off); on a GPU, the decoder passes the mask as a flex attention ``BlockMask``
(``_flex_attention``).
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tune.modules._context_parallel import ContextParallelMask
from tune.modules._flex_attention import BlockMask, flex_attend
from tune.modules._kv_cache import KVCache
from tune.modules._packed_attention import MaskSpans, attend_documents, is_candidate_mask

# Decoding with a KV cache on a GPU: every step attends one more cached key, so every call has a new shape, and
# cuDNN's attention plans its kernel per shape on the host (about 2.5 ms a call on an H200, several times the
# GPU's work for a 1B model's decode step). The other backends have no such cost.
_DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class MultiHeadAttention(nn.Module):
    """Self-attention whose projections, norms and position embedding are given by the builder.

    ``num_kv_heads == num_heads`` is multi-head attention, ``1 < num_kv_heads < num_heads`` grouped-query
    attention (Ainslie et al., 2023, https://arxiv.org/abs/2305.13245), ``num_kv_heads == 1`` multi-query.
    Attention runs through ``F.scaled_dot_product_attention`` (its ``is_causal`` fast path when no mask is needed),
    except with logit soft-capping, which SDPA cannot express and which therefore uses an explicit float32
    softmax.

    ``split_packed_documents`` (default True) lets a packed batch on CPU attend one document at a time (see
    ``tune.modules._packed_attention``: same result, faster); set it to False on a layer to always run the one
    masked SDPA call (for tests and debugging).

    Args:
        embed_dim (int): model width.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads; must divide ``num_heads``.
        head_dim (int): features per head.
        q_proj (nn.Module): embed_dim -> num_heads * head_dim.
        k_proj (nn.Module): embed_dim -> num_kv_heads * head_dim.
        v_proj (nn.Module): embed_dim -> num_kv_heads * head_dim.
        output_proj (nn.Module): num_heads * head_dim -> embed_dim.
        pos_embeddings (nn.Module | None): applied to queries and keys [b, s, heads, head_dim] as
            ``pos_embeddings(x, input_pos=...)``; None for no position embedding.
        q_norm (nn.Module | None): per-head norm of the queries before RoPE (Qwen3).
        k_norm (nn.Module | None): per-head norm of the keys before RoPE.
        kv_cache (KVCache | None): a cache for generation; usually created by ``setup_cache``.
        max_seq_len (int): the default KV-cache capacity. Default 4096.
        is_causal (bool): causal masking when no mask is given. Default True.
        attn_dropout (float): dropout on attention probabilities during training. Default 0.0.
        scale (float | None): multiplies q·k; default ``head_dim ** -0.5`` (Gemma 2 uses
            ``query_pre_attn_scalar ** -0.5``).
        sliding_window (int | None): a query attends only keys fewer than this many tokens back (Mistral,
            Gemma 2 local layers, Phi-3). None for full attention.
        softcapping (float | None): caps attention logits smoothly to ``(-c, c)`` with ``c * tanh(x / c)``
            (Gemma 2). None for no capping.
        attention_chunk_size (int | None): chunked local attention: positions are cut into consecutive chunks of
            this many tokens, and a query attends only keys of its own chunk (Llama 4's RoPE layers). Chunks
            follow ``input_pos`` when given (so each packed document, and the real tokens of a left-padded row,
            start a chunk of their own), else the token index (with a KV cache: the index in the cache). None for
            no chunking.
        query_scaling (nn.Module | None): applied to the queries [b, s, num_heads, head_dim] after the position
            embedding as ``query_scaling(q, input_pos=...)`` (``input_pos`` None for ``0..s-1``): a
            position-dependent query temperature (Llama 4's NoPE layers). None for none.

    Raises:
        ValueError: if the head counts are inconsistent or a probability is out of range.
    """

    def __init__(
        self,
        *,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_proj: nn.Module,
        k_proj: nn.Module,
        v_proj: nn.Module,
        output_proj: nn.Module,
        pos_embeddings: nn.Module | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        kv_cache: KVCache | None = None,
        max_seq_len: int = 4096,
        is_causal: bool = True,
        attn_dropout: float = 0.0,
        scale: float | None = None,
        sliding_window: int | None = None,
        softcapping: float | None = None,
        attention_chunk_size: int | None = None,
        query_scaling: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) so query heads split "
                "evenly into key/value groups."
            )
        if not 0.0 <= attn_dropout <= 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1], got {attn_dropout}.")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be given together (both or neither).")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of tokens or None, got {sliding_window}.")
        if attention_chunk_size is not None and attention_chunk_size < 1:
            raise ValueError(
                f"attention_chunk_size must be a positive number of tokens or None, got {attention_chunk_size}."
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.is_causal = is_causal
        self.attn_dropout = attn_dropout
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        self.softcapping = softcapping
        self.attention_chunk_size = attention_chunk_size
        self.q_proj = q_proj
        self.k_proj = k_proj
        self.v_proj = v_proj
        self.output_proj = output_proj
        self.pos_embeddings = pos_embeddings
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.query_scaling = query_scaling
        self.kv_cache = kv_cache
        # False makes forward ignore the cache without freeing it (`tune.modules.disable_kv_cache`).
        self.cache_enabled = True
        # False always runs one masked SDPA call, never the per-document attention of `_packed_attention`.
        self.split_packed_documents = True

    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int | None = None) -> None:
        """Allocates a KV cache (on the device of ``q_proj``'s parameters) for generation."""
        device = next(self.q_proj.parameters()).device
        self.kv_cache = KVCache(
            batch_size, max_seq_len or self.max_seq_len, self.num_kv_heads, self.head_dim, dtype, device
        )

    def reset_cache(self) -> None:
        """Empties the KV cache.

        Raises:
            RuntimeError: if no cache was set up.
        """
        if self.kv_cache is None:
            raise RuntimeError("No KV cache to reset: call setup_cache (or model.setup_caches) first.")
        self.kv_cache.reset()

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attends ``x`` to itself (and to the cached past during generation), or to ``y``.

        Args:
            x (torch.Tensor): [b, s, embed_dim].
            y (torch.Tensor | None): [b, s_y, embed_dim] the keys and values are computed from instead of ``x``
                (cross-attention, e.g. text attending image features). The layer must then be built with
                ``is_causal=False`` and no ``pos_embeddings``; the KV cache is neither read nor written. Default None
                (self-attention).
            mask (torch.Tensor | None): [b, s, s_kv] bool, True where a query may attend a key; None for causal
                (or no) masking. With a KV cache, ``s_kv`` may be the cache capacity or the number of cached
                tokens after this step.
            input_pos (torch.Tensor | None): [b, s] positions for RoPE; None for ``0..s-1`` (offset by the cached
                tokens when a KV cache is active).

        Returns:
            torch.Tensor: [b, s, embed_dim].

        Raises:
            ValueError: if ``y`` is given to a causal layer or one with a position embedding.
        """
        batch_size, seq_len, _ = x.shape
        kv_cache = self.kv_cache if self.cache_enabled else None
        if y is not None:
            self._check_cross_attention()
            kv_cache = None  # cross-attention keys are the other sequence's: nothing to append
        kv_input = x if y is None else y
        kv_len = kv_input.shape[1]
        # projections, [b, s, heads, head_dim] (keys and values: [b, s_kv, kv_heads, head_dim])
        q = self.q_proj(x).view(batch_size, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(kv_input).view(batch_size, kv_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(kv_input).view(batch_size, kv_len, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # position embedding, after the tokens already in the cache
        offset = kv_cache.size if kv_cache is not None else 0
        if input_pos is None and offset and (self.pos_embeddings is not None or self.query_scaling is not None):
            input_pos = torch.arange(offset, offset + seq_len, device=x.device).expand(batch_size, seq_len)
        if self.pos_embeddings is not None:
            q = self.pos_embeddings(q, input_pos=input_pos)
            k = self.pos_embeddings(k, input_pos=input_pos)
        if self.query_scaling is not None:
            q = self.query_scaling(q, input_pos=input_pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, s, head_dim]
        # KV cache: the keys and values of earlier steps join this step's
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # [b, num_kv_heads, s_kv, head_dim]
        # attention
        # chunked attention groups the keys by the queries' positions only where keys and queries are the same tokens
        chunk_pos = input_pos if kv_cache is None else None
        out = self._attend(q, k, v, mask, offset, chunk_pos)  # [b, num_heads, s, head_dim]
        # output projection
        out = out.transpose(1, 2).reshape(batch_size, seq_len, self.num_heads * self.head_dim)
        return self.output_proj(out)

    def _check_cross_attention(self) -> None:
        if self.is_causal or self.pos_embeddings is not None or self.query_scaling is not None:
            raise ValueError(
                "MultiHeadAttention got y (cross-attention), but it was built for self-attention: build it with "
                "is_causal=False, pos_embeddings=None and query_scaling=None to attend another sequence."
            )

    def supports_block_mask(self) -> bool:
        """Whether ``forward`` may be given a flex attention ``BlockMask`` in place of a dense mask: no sliding
        window, soft-capping, chunked attention, attention dropout or active KV cache, which the dense path applies
        on top of the mask."""
        return (
            self.sliding_window is None
            and self.softcapping is None
            and self.attention_chunk_size is None
            and (self.attn_dropout == 0.0 or not self.training)
            and not (self.kv_cache is not None and self.cache_enabled)
        )

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        offset: int,
        chunk_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scaled dot-product attention of q [b, num_heads, s, head_dim] over k, v [b, num_kv_heads, s_kv, head_dim]."""
        dropout = self.attn_dropout if self.training else 0.0
        enable_gqa = self.num_kv_heads != self.num_heads
        if isinstance(mask, BlockMask):  # a packed batch on a GPU, see supports_block_mask
            return flex_attend(q, k, v, mask, scale=self.scale, enable_gqa=enable_gqa)
        if isinstance(mask, ContextParallelMask):  # this rank holds a slice of the sequence (_context_parallel)
            return mask.attend(q, k, v, scale=self.scale, enable_gqa=enable_gqa)
        spans = self._packed_document_spans(mask, q)
        if spans is not None:  # a packed batch on CPU: one causal call per document, same result (_packed_attention)
            return attend_documents(q, k, v, spans, scale=self.scale, dropout_p=dropout, enable_gqa=enable_gqa)
        attn_mask = self._build_mask(mask, q.shape[2], k.shape[2], offset, q.device, chunk_pos)
        if self.softcapping is not None:
            return self._softcapped_attention(q, k, v, attn_mask, dropout)
        is_causal = attn_mask is None and self.is_causal and q.shape[2] == k.shape[2]
        attend = functools.partial(
            F.scaled_dot_product_attention,
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=self.scale,
            enable_gqa=enable_gqa,
        )
        if q.is_cuda and self.kv_cache is not None and self.cache_enabled:
            with sdpa_kernel(_DECODE_BACKENDS):
                return attend()
        return attend()

    def _build_mask(
        self,
        mask: torch.Tensor | None,
        seq_len: int,
        kv_len: int,
        offset: int,
        device: torch.device,
        chunk_pos: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """A [b or 1, 1, s, s_kv] bool mask, or None when SDPA's is_causal (or no mask) says the same."""
        window = self.sliding_window if self.sliding_window is not None and kv_len > self.sliding_window else None
        chunk = self.attention_chunk_size
        if chunk is not None and chunk_pos is None and kv_len <= chunk:
            chunk = None  # every index falls in the first chunk
        if mask is None and chunk is None:
            if not self.is_causal and window is None:
                return None
            if offset == 0 and window is None and self.softcapping is None:
                return None  # plain causal: is_causal fast path
            if offset and seq_len == 1 and window is None:
                return None  # one new token may see the whole cache
        q_idx = torch.arange(offset, offset + seq_len, device=device)[:, None]
        k_idx = torch.arange(kv_len, device=device)[None, :]
        if mask is None:
            if self.is_causal:
                allowed = (k_idx <= q_idx)[None]  # [1, s, s_kv]
            else:
                allowed = torch.ones(1, seq_len, kv_len, dtype=torch.bool, device=device)
        else:
            allowed = self._fit_mask(mask, seq_len, kv_len)
        if window is not None:
            allowed = allowed & (k_idx > q_idx - window)[None]
        if chunk is not None:
            if chunk_pos is None:  # by index: the queries are the last seq_len of the kv_len keys
                q_chunk, k_chunk = (q_idx // chunk)[None], (k_idx // chunk)[None]  # [1, s, 1], [1, 1, s_kv]
            else:  # by position: the keys are the queries' own tokens
                q_chunk, k_chunk = (chunk_pos // chunk)[:, :, None], (chunk_pos // chunk)[:, None, :]
            allowed = allowed & (q_chunk == k_chunk)
        return allowed[:, None]

    @staticmethod
    def _fit_mask(mask: torch.Tensor, seq_len: int, kv_len: int) -> torch.Tensor:
        if mask.dim() != 3 or mask.shape[1] != seq_len:
            raise ValueError(
                f"mask must be [batch, seq, seq_kv] bool with seq={seq_len}, got shape {tuple(mask.shape)}."
            )
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}.")
        if mask.shape[2] >= kv_len:
            return mask[:, :, :kv_len]  # a mask over the whole cache capacity: only filled entries matter
        return F.pad(mask, (0, kv_len - mask.shape[2]), value=False)

    def _softcapped_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout: float,
    ) -> torch.Tensor:
        # SDPA has no hook between q·k and softmax, so capping needs the scores materialised (Gemma 2).
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # query head h uses key/value head h // groups
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [b, num_heads, s, s_kv]
        scores = torch.tanh(scores / self.softcapping) * self.softcapping
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        probs = F.dropout(probs, p=dropout, training=self.training)
        return torch.matmul(probs, v)

    def _packed_document_spans(self, mask: torch.Tensor | None, q: torch.Tensor) -> list[int] | None:
        """The document lengths of a packed batch that may attend one document at a time, else None."""
        if not self.split_packed_documents or (self.kv_cache is not None and self.cache_enabled):
            return None
        if not self.is_causal or self.sliding_window is not None or self.softcapping is not None:
            return None  # attend_documents computes plain causal attention
        if self.attention_chunk_size is not None:
            return None
        if not is_candidate_mask(mask, q):
            return None
        return _document_spans(mask)


# The per-document path for packed batches (see _packed_attention): its threshold, and the spans of the last mask
# seen. Every layer of a model receives the same mask object, so the first layer finds its spans (a pass over the
# [b, s, s] mask and a read of the document starts) and the others reuse them.

# Below this mean document length, one SDPA call per document costs more than the masked blocks it skips.
_MIN_MEAN_DOCUMENT_LEN = 16
# One entry, for the last mask seen, which it holds weakly; None before the first.
_spans_cache: MaskSpans | None = None


def _document_spans(mask: torch.Tensor) -> list[int] | None:
    """The document lengths of a block-causal ``mask`` [b, s, s] (``_packed_attention.document_spans``), cached."""
    global _spans_cache
    if _spans_cache is None or not _spans_cache.matches(mask, _MIN_MEAN_DOCUMENT_LEN):
        _spans_cache = MaskSpans.find(mask, _MIN_MEAN_DOCUMENT_LEN)
    return _spans_cache.spans
