"""Attention under context parallelism: each rank holds a slice of every sequence and attends it to the whole.

The layout (load-balanced for causal attention): a sequence of ``S`` tokens on ``N`` ranks is cut into ``2N`` chunks
of ``C = S / 2N`` tokens, and rank ``r`` holds chunks ``r`` and ``2N - 1 - r``. A causal query attends every key
before it, so an early chunk costs little and a late one much; pairing them gives every rank the same work.

What a layer computes. Queries stay on their rank; keys and values are gathered from the whole group (an
all-gather in forward, a reduce-scatter of their gradients in backward), as the Llama 3 report describes for its
long-context training (https://arxiv.org/abs/2407.21783, section 3.3.2). Each local chunk then attends:

- without a mask (unpacked rows): every earlier chunk's keys without masking, and its own chunk causally.
  :class:`_CausalChunkAttention` runs one block per key chunk with the fused kernels that also return the softmax
  normaliser (log-sum-exp), merges them exactly, and computes the gradients block by block from the merged output,
  so nothing of size ``C x S`` is ever stored, and the gathered keys are neither reordered nor expanded to the
  query heads;
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


# A block of keys for a query chunk: (the rank holding it, which of that rank's two chunks it is, whether the
# query chunk attends it causally, i.e. it is the query chunk itself).
Block = tuple[int, int, bool]


def causal_blocks(rank: int, size: int) -> list[list[Block]]:
    """For each of ``rank``'s two chunks (in local order), the key chunks causal attention reads: every earlier
    chunk whole, then its own causally; each named by where the gathered keys hold it."""
    holder = {chunk: (r, half) for r in range(size) for half, chunk in enumerate(load_balanced_chunks(r, size))}
    return [[(*holder[key], key == chunk) for key in range(chunk + 1)] for chunk in load_balanced_chunks(rank, size)]


def _stack_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, h, L, ...] -> [b, h_kv, groups * L, ...]: the query heads that share a key/value head, one after the
    other, so that they attend the unexpanded keys (query head h uses key/value head h // groups)."""
    batch_size, heads, length = x.shape[:3]
    return x.reshape(batch_size, heads // groups, groups * length, *x.shape[3:])


def _unstack_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch_size, kv_heads, length = x.shape[:3]
    return x.reshape(batch_size, kv_heads * groups, length // groups, *x.shape[3:])


def _expand_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1)


def _sum_heads(grad: torch.Tensor, groups: int) -> torch.Tensor:
    batch_size, heads, length, head_dim = grad.shape
    return grad.view(batch_size, heads // groups, groups, length, head_dim).sum(2)


def _grouped_forward(
    q: torch.Tensor, q_stacked: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block with grouped heads: stacked queries over the unexpanded keys (no copy of the keys), except for the
    causal block, whose mask needs the query positions in place: its one chunk of keys is expanded instead."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return _block_forward(q, k, v, causal, scale)
    if causal:
        return _block_forward(q, _expand_heads(k, groups), _expand_heads(v, groups), True, scale)
    out, lse = _block_forward(q_stacked, k, v, False, scale)
    return _unstack_heads(out, groups), _unstack_heads(lse, groups)


def _grouped_backward(
    chunk: list[torch.Tensor], stacked: list[torch.Tensor], k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_block_backward` of :func:`_grouped_forward`'s block; ``chunk`` and ``stacked`` hold the chunk's
    (grad_out, q, out, lse), as they are and with stacked heads."""
    grad_out, q, out, lse = chunk
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return _block_backward(grad_out, q, k, v, out, lse, causal, scale)
    if causal:
        k_heads, v_heads = _expand_heads(k, groups), _expand_heads(v, groups)
        grad_q, grad_k, grad_v = _block_backward(grad_out, q, k_heads, v_heads, out, lse, True, scale)
        return grad_q, _sum_heads(grad_k, groups), _sum_heads(grad_v, groups)
    grad_out, q, out, lse = stacked
    grad_q, grad_k, grad_v = _block_backward(grad_out, q, k, v, out, lse, False, scale)
    return _unstack_heads(grad_q, groups), grad_k, grad_v


class _CausalChunkAttention(torch.autograd.Function):
    """Causal attention of this rank's two query chunks over every rank's keys, without a mask.

    q [b, h, 2C, d]; k, v [size, b, h_kv, 2C, d] as gathered (rank r's chunks r and 2 size - 1 - r). Each query
    chunk attends its blocks (:func:`causal_blocks`) one kernel call each, merged through their log-sum-exps;
    backward runs each block's backward kernel with the merged output and log-sum-exp, and adds the key and value
    gradients into the gathered layout, which the all-gather's backward then sums back to their ranks. Saves q, the
    gathered k and v, the output and the log-sum-exp; keys are never copied into global order or expanded to the
    query heads (only a causal block's one chunk is).
    """

    @staticmethod
    def forward(ctx, q, k, v, plan: list[list[Block]], scale: float):
        chunk_len, groups = q.shape[2] // 2, q.shape[1] // k.shape[2]
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)
        for index, blocks in enumerate(plan):
            rows = slice(index * chunk_len, (index + 1) * chunk_len)
            q_chunk = q[:, :, rows]
            q_stacked = _stack_heads(q_chunk, groups) if groups > 1 else q_chunk
            merged_out, merged_lse = None, None
            for rank, half, causal in blocks:
                cols = slice(half * chunk_len, (half + 1) * chunk_len)
                block_out, block_lse = _grouped_forward(
                    q_chunk, q_stacked, k[rank, :, :, cols], v[rank, :, :, cols], causal, scale
                )
                merged_out, merged_lse = _merge(merged_out, merged_lse, block_out.float(), block_lse)
            out[:, :, rows] = merged_out
            lse[:, :, rows] = merged_lse
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        chunk_len, groups = q.shape[2] // 2, q.shape[1] // k.shape[2]
        grad_out = grad_out.contiguous()
        grad_q = torch.zeros_like(q, memory_format=torch.contiguous_format)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        for index, blocks in enumerate(ctx.plan):
            rows = slice(index * chunk_len, (index + 1) * chunk_len)
            chunk = [grad_out[:, :, rows], q[:, :, rows], out[:, :, rows], lse[:, :, rows]]
            stacked = [_stack_heads(t, groups) for t in chunk] if groups > 1 else chunk
            for rank, half, causal in blocks:
                cols = slice(half * chunk_len, (half + 1) * chunk_len)
                dq, dk, dv = _grouped_backward(
                    chunk, stacked, k[rank, :, :, cols], v[rank, :, :, cols], causal, ctx.scale
                )
                grad_q[:, :, rows] += dq
                grad_k[rank, :, :, cols] += dk
                grad_v[rank, :, :, cols] += dv
        return grad_q, grad_k, grad_v, None, None


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
        if self.dense_mask is not None:
            k, v = self.gather(k), self.gather(v)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.dense_mask[:, None], scale=scale, enable_gqa=enable_gqa
            )
        k, v = _GatherSequence.apply(k, self.group), _GatherSequence.apply(v, self.group)
        return _CausalChunkAttention.apply(q, k, v, causal_blocks(self.rank, self.size), scale)
