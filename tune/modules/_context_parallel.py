"""Attention under context parallelism: each rank holds a slice of every sequence and attends it to the whole.

The layout (load-balanced for causal attention): a sequence of ``S`` tokens on ``N`` ranks is cut into ``2N`` chunks
of ``C = S / 2N`` tokens, and rank ``r`` holds chunks ``r`` and ``2N - 1 - r``. A causal query attends every key
before it, so an early chunk costs little and a late one much; pairing them gives every rank the same work.

What a layer computes. Queries stay on their rank; keys and values are gathered from the whole group (an
all-gather in forward, a reduce-scatter of their gradients in backward), as the Llama 3 report describes for its
long-context training (https://arxiv.org/abs/2407.21783, section 3.3.2). Each local chunk then attends:

- without a mask (unpacked rows): the keys of the earlier chunks without masking, and its own chunk causally.
  :class:`_ChunkedCausalAttention` runs the two blocks with the fused kernels that also return the softmax
  normaliser (log-sum-exp), merges them exactly, and computes the gradients block by block from the merged output,
  so nothing of size ``C x S`` is ever stored;
- with a dense mask (packed rows, padding-free batches): its rows of the mask over all keys, in one masked SDPA call
  (the mask itself is ``S x S`` already).

The result equals one device's attention up to float rounding. Model code is unchanged: the recipe passes a
:class:`ContextParallelMask` as the ``mask`` of the model's forward and every ``MultiHeadAttention`` hands its
queries, keys and values to :meth:`ContextParallelMask.attend`. ``tune.training.ContextParallel`` builds it and
cuts the batch.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["ContextParallelMask", "load_balanced_chunks"]


def load_balanced_chunks(rank: int, size: int) -> tuple[int, int]:
    """The two chunks (of ``2 * size``) that ``rank`` holds: an early one and its mirror from the end."""
    return rank, 2 * size - 1 - rank


class _GatherSequence(torch.autograd.Function):
    """All-gathers [b, h, s_local, d] over a process group into [size, b, h, s_local, d]; backward reduce-scatters
    (sums) the gradient, since every rank's queries attend every rank's keys."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        size = dist.get_world_size(group)
        gathered = x.new_empty((size * x.shape[0], *x.shape[1:]))  # ranks' tensors one after another along dim 0
        dist.all_gather_single(gathered, x.contiguous(), group=group)
        return gathered.view(size, *x.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "gloo":  # gloo has no reduce-scatter: sum everything, keep this rank's
            dist.all_reduce(grad, group=ctx.group)
            return grad[dist.get_rank(ctx.group)].clone(), None
        local = grad.new_empty(grad.shape[1:])
        dist.reduce_scatter_single(local, grad.flatten(0, 1), group=ctx.group)
        return local, None


def _block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [b, h, L, d] over k, v [b, h, L_k, d] and its log-sum-exp [b, h, L] (fp32)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal, scale=scale
    )
    return out, lse[..., : q.shape[2]]  # the kernel pads the sequence dimension of its log-sum-exp


def _block_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of one block given the merged output and log-sum-exp of all the blocks its queries attend: the
    kernels compute the softmax from ``lse`` and its correction from ``out``, so the block's share is exact."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
        )
    padded = F.pad(lse, (0, -lse.shape[-1] % 32))  # the kernel reads the log-sum-exp padded to its tile size
    seed = torch.zeros((), dtype=torch.int64, device=q.device)  # no dropout: the random state is not read
    grad_q, grad_k, grad_v, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, padded, seed, seed, 0.0, [True, True, True, False], causal, scale=scale
    )
    return grad_q, grad_k, grad_v


# A segment of the local queries and the key blocks it attends: (query start, query end, [(key start, key end,
# causal), ...]), in local query and global key indices.
Segment = tuple[int, int, list[tuple[int, int, bool]]]


def causal_segments(rank: int, size: int, chunk_len: int) -> list[Segment]:
    """What each of ``rank``'s two chunks attends under causal attention: the earlier chunks' keys without a mask,
    then its own chunk causally."""
    segments = []
    for index, chunk in enumerate(load_balanced_chunks(rank, size)):
        start = chunk * chunk_len
        blocks = [(0, start, False)] if start else []
        blocks.append((start, start + chunk_len, True))
        segments.append((index * chunk_len, (index + 1) * chunk_len, blocks))
    return segments


class _ChunkedCausalAttention(torch.autograd.Function):
    """Causal attention of this rank's query chunks over the whole sequence's keys, without a mask.

    q [b, h, s_local, d]; k, v [b, h_kv, S, d] in global order. Each segment's blocks are merged through their
    log-sum-exps; backward recomputes nothing but runs each block's backward kernel with the merged statistics.
    Saves q, the unexpanded k and v, the output and the log-sum-exp: linear in the sequence length.
    """

    @staticmethod
    def forward(ctx, q, k, v, segments: list[Segment], scale: float):
        groups = q.shape[1] // k.shape[1]
        k_heads, v_heads = _expand_heads(k, groups), _expand_heads(v, groups)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)
        for q_start, q_end, blocks in segments:
            q_seg = q[:, :, q_start:q_end]
            merged_out, merged_lse = None, None
            for k_start, k_end, causal in blocks:
                block_out, block_lse = _block_forward(
                    q_seg, k_heads[:, :, k_start:k_end], v_heads[:, :, k_start:k_end], causal, scale
                )
                merged_out, merged_lse = _merge(merged_out, merged_lse, block_out.float(), block_lse)
            out[:, :, q_start:q_end] = merged_out
            lse[:, :, q_start:q_end] = merged_lse
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.segments, ctx.scale = segments, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        groups = q.shape[1] // k.shape[1]
        k_heads, v_heads = _expand_heads(k, groups), _expand_heads(v, groups)
        grad_out = grad_out.contiguous()
        grad_q = torch.zeros_like(q, memory_format=torch.contiguous_format)
        grad_k = torch.zeros_like(k_heads, memory_format=torch.contiguous_format)
        grad_v = torch.zeros_like(v_heads, memory_format=torch.contiguous_format)
        for q_start, q_end, blocks in ctx.segments:
            rows = slice(q_start, q_end)
            for k_start, k_end, causal in blocks:
                cols = slice(k_start, k_end)
                dq, dk, dv = _block_backward(
                    grad_out[:, :, rows],
                    q[:, :, rows],
                    k_heads[:, :, cols],
                    v_heads[:, :, cols],
                    out[:, :, rows],
                    lse[:, :, rows],
                    causal,
                    ctx.scale,
                )
                grad_q[:, :, rows] += dq
                grad_k[:, :, cols] += dk
                grad_v[:, :, cols] += dv
        return grad_q, _sum_heads(grad_k, groups), _sum_heads(grad_v, groups), None, None


def _expand_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    # query head h uses key/value head h // groups (grouped-query attention)
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _sum_heads(grad: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return grad
    batch_size, heads, seq_len, head_dim = grad.shape
    return grad.view(batch_size, heads // groups, groups, seq_len, head_dim).sum(2)


def _merge(
    out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over two disjoint key sets from each one's output and log-sum-exp (fp32)."""
    if out is None or lse is None:
        return block_out, block_lse
    merged_lse = torch.logaddexp(lse, block_lse)
    merged = out * torch.exp(lse - merged_lse)[..., None] + block_out * torch.exp(block_lse - merged_lse)[..., None]
    return merged, merged_lse


class ContextParallelMask:
    """Stands for the attention mask of a context-parallel forward: which keys this rank's queries attend, and the
    group their keys and values are gathered from.

    Pass it as the ``mask`` of a decoder's forward (``tune.training.ContextParallel.shard`` makes it, with the
    tokens, labels and positions of this rank's chunks). ``MultiHeadAttention`` then calls :meth:`attend`.

    Args:
        group (ProcessGroup): the context-parallel group.
        seq_len (int): the whole (padded) sequence length ``S``, a multiple of ``2 * group size``.
        dense_mask (torch.Tensor | None): [b, s_local, S] bool rows of the batch's mask for this rank's queries, keys
            in global order; None for causal attention.
    """

    def __init__(self, group: dist.ProcessGroup, seq_len: int, dense_mask: torch.Tensor | None = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if seq_len % (2 * self.size):
            raise ValueError(f"seq_len={seq_len} must be a multiple of 2 x the context-parallel size {self.size}.")
        self.seq_len = seq_len
        self.chunk_len = seq_len // (2 * self.size)
        self.dense_mask = dense_mask

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's [b, h, 2C, d] keys or values -> the whole sequence's [b, h, S, d], in global order."""
        gathered = _GatherSequence.apply(x, self.group)  # [size, b, h, 2C, d]: rank i's chunks i and 2N-1-i
        chunks = [None] * (2 * self.size)
        for rank in range(self.size):
            first, second = load_balanced_chunks(rank, self.size)
            chunks[first] = gathered[rank, :, :, : self.chunk_len]
            chunks[second] = gathered[rank, :, :, self.chunk_len :]
        return torch.cat(chunks, dim=2)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, enable_gqa: bool
    ) -> torch.Tensor:
        """Attention of this rank's queries q [b, h, 2C, d] over the whole sequence's keys and values, from this
        rank's k, v [b, h_kv, 2C, d]. Returns [b, h, 2C, d]."""
        if q.shape[2] != 2 * self.chunk_len:
            raise ValueError(
                f"context parallelism over {self.size} ranks expects {2 * self.chunk_len} local positions (2 chunks of "
                f"{self.chunk_len}), got {q.shape[2]}: shard the batch with tune.training.ContextParallel.shard."
            )
        k, v = self.gather(k), self.gather(v)
        if self.dense_mask is not None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.dense_mask[:, None], scale=scale, enable_gqa=enable_gqa
            )
        segments = causal_segments(self.rank, self.size, self.chunk_len)
        return _ChunkedCausalAttention.apply(q, k, v, segments, scale)
