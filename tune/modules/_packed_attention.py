"""Packed batches on CPU: block-causal attention computed one document at a time.

What it computes. A packed row holds several documents end to end, and its block-causal mask lets a token attend
the tokens of its own document up to itself. Attention under that mask is causal attention within each document,
so ``MultiHeadAttention`` can replace its one masked SDPA call by one ``is_causal`` call per document
(:func:`attend_documents`), with the same result up to float32 rounding, gradients included.
``tests/tune/modules/test_packed_attention.py`` compares the two; ``split_packed_documents = False`` on a
``MultiHeadAttention`` always takes the masked call.

Why it is faster. With a dense mask, SDPA on CPU computes all ``s x s`` scores of a row and then discards the ones
the mask removes; per document it computes ``sum(len_i ** 2)`` of them. Splitting with views and ``squeeze``
instead of indexing lets backward reshape each document's gradient instead of scattering it into a zero tensor.
The measured gains are in benchmarks/README.md ("Where the time goes").

When it applies (``MultiHeadAttention._packed_document_spans`` checks, with :func:`is_candidate_mask` and
:func:`document_spans`):

- causal attention without a sliding window, logit soft-capping or a KV cache (training);
- on CPU, where reading the document lengths from the mask costs no host-device synchronisation, and not under
  ``torch.compile``, where lengths that change with every batch would recompile the graph;
- a ``[b, s, s]`` bool mask that is exactly block-causal (padding at the end of a row counts as one more document);
- documents of at least ``_MIN_MEAN_DOCUMENT_LEN`` tokens on average (16, set in ``_attention``): below that one SDPA
  call per document costs more than the masked blocks it skips. A padded batch's mask, where each padding query
  attends only itself, has one-token documents and stays on the masked call.

Every layer of a model receives the same mask object, so ``_attention`` keeps the spans of the last mask it saw
(:class:`MaskSpans`): the first layer finds them, the others reuse them.
"""

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def is_candidate_mask(mask: torch.Tensor | None, q: torch.Tensor) -> bool:
    """Whether ``mask`` may be the block-causal mask of a packed batch that :func:`attend_documents` can take.

    Args:
        mask (torch.Tensor | None): the mask given to attention.
        q (torch.Tensor): the queries, [b, num_heads, s, head_dim].

    Returns:
        bool: True for a [b, s, s] bool mask on CPU outside ``torch.compile``; its contents are checked by
        :func:`document_spans`. Malformed masks are left to the masked call, which reports them.
    """
    if mask is None or mask.device.type != "cpu" or q.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    seq_len = q.shape[2]
    return mask.dim() == 3 and mask.dtype == torch.bool and mask.shape[1] == mask.shape[2] == seq_len


def document_spans(mask: torch.Tensor, min_mean_document_len: float) -> list[int] | None:
    """The lengths of the documents that tile the flattened ``[b * s]`` positions, if ``mask`` is block-causal.

    Args:
        mask (torch.Tensor): [b, s, s] bool, True where a query may attend a key.
        min_mean_document_len (float): None is returned when the documents are shorter than this on average.

    Returns:
        list[int] | None: the document lengths, row after row (they sum to ``b * s``); None when some query
        attends anything else than the keys from the start of its own run of positions up to itself, or when the
        documents are too short.
    """
    batch_size, seq_len, _ = mask.shape
    positions = torch.arange(seq_len, device=mask.device)
    first_key = mask.to(torch.uint8).argmax(-1)  # [b, s]: the first key each query attends
    starts_here = first_key == positions  # [b, s]: a query whose first key is itself opens a document
    run_start = torch.where(starts_here, positions, 0).cummax(-1).values  # [b, s]: where its document opened
    block_causal = (positions >= run_start[..., None]) & (positions <= positions[:, None])  # [b, s, s]
    if not (torch.equal(first_key, run_start) and torch.equal(mask, block_causal)):
        return None
    starts = starts_here.flatten().nonzero().flatten().tolist() + [batch_size * seq_len]
    if len(starts) - 1 > batch_size * seq_len / min_mean_document_len:
        return None
    return [end - start for start, end in zip(starts, starts[1:])]


@dataclass(frozen=True)
class MaskSpans:
    """The :func:`document_spans` of one mask, kept so that later calls with the same mask skip the search.

    The mask is held weakly (a kept entry never keeps a batch alive) with its version counter, so another mask,
    a freed one or the same one changed in place does not match.
    """

    mask: weakref.ref
    version: int
    min_mean_document_len: float
    spans: list[int] | None

    @classmethod
    def find(cls, mask: torch.Tensor, min_mean_document_len: float) -> "MaskSpans":
        """Runs :func:`document_spans` on ``mask`` and records the answer."""
        spans = document_spans(mask, min_mean_document_len)
        return cls(weakref.ref(mask), mask._version, min_mean_document_len, spans)

    def matches(self, mask: torch.Tensor, min_mean_document_len: float) -> bool:
        """Whether this entry answers for ``mask``, unchanged since, under the same threshold."""
        return (
            self.mask() is mask
            and self.version == mask._version
            and self.min_mean_document_len == min_mean_document_len
        )


def attend_documents(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: list[int],
    *,
    scale: float,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Causal attention within each document of a packed batch, laid out as ``F.scaled_dot_product_attention``.

    Args:
        q (torch.Tensor): [b, num_heads, s, head_dim].
        k (torch.Tensor): [b, num_kv_heads, s, head_dim].
        v (torch.Tensor): [b, num_kv_heads, s, head_dim].
        spans (list[int]): document lengths tiling the flattened ``b * s`` positions (:func:`document_spans`).
        scale (float): multiplies q·k.
        dropout_p (float): dropout on the attention probabilities. Default 0.0.
        enable_gqa (bool): key/value heads shared by groups of query heads. Default False.

    Returns:
        torch.Tensor: [b, num_heads, s, head_dim].
    """
    batch_size, num_heads, seq_len, head_dim = q.shape
    # [b * s, heads, head_dim]: a view when q, k, v are transposes of [b, s, heads, head_dim] tensors, as
    # MultiHeadAttention makes them. Documents are consecutive runs of these positions, so split gives a view of
    # each, and backward joins their gradients with one concatenation.
    per_document = zip(*(t.transpose(1, 2).flatten(0, 1).split(spans) for t in (q, k, v)))
    outputs = [
        F.scaled_dot_product_attention(
            q_doc.transpose(0, 1).unsqueeze(0),  # [1, heads, doc_len, head_dim]
            k_doc.transpose(0, 1).unsqueeze(0),
            v_doc.transpose(0, 1).unsqueeze(0),
            dropout_p=dropout_p,
            is_causal=True,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        .squeeze(0)  # rather than [0]: squeeze's backward is a view, not a copy into zeros
        .transpose(0, 1)  # [doc_len, heads, head_dim]
        for q_doc, k_doc, v_doc in per_document
    ]
    return torch.cat(outputs).view(batch_size, seq_len, num_heads, head_dim).transpose(1, 2)
