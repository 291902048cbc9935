"""Context parallelism: the ranks of a ``cp`` group each train on a slice of every sequence.

A run with ``context_parallel_dim: N`` has the device mesh ``(dp_shard, cp, tp)``. The ``N`` ranks of a ``cp`` group
read the same batch; :meth:`ContextParallel.shard` keeps this rank's two chunks of each sequence (an early one and
its mirror from the end, so every rank has the same causal work) with their global positions, and hands the model a
:class:`~tune.modules.ContextParallelMask` in place of the attention mask, through which every attention layer
gathers the whole sequence's keys and values (``tune.modules._context_parallel``). Activations therefore scale with
``S / N`` per rank; FSDP shards the weights over ``dp_shard x cp`` ranks.

The loss. Each rank computes its chunks' summed token loss and :meth:`ContextParallel.sum` adds them over the group
(a differentiable all-reduce), so every rank of a group holds the whole sequences' loss, as one device would. Its
gradient is then the group's sum, which FSDP's mean over ``dp_shard x cp`` ranks turns back into the data-parallel
mean: the recipes' token counting and ``training.step_loss_scale`` stay as they are.
"""

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tune.modules import ContextParallelMask, MultiHeadAttention, TransformerDecoder
from tune.modules._context_parallel import load_balanced_chunks
from tune.modules.moe import moe_layers

CP = "cp"

# batch keys shard() knows how to cut; anything else (images, encoder masks) has no context-parallel layout
_SHARDED_INPUTS = ("mask", "input_pos")


class ContextParallel:
    """Cuts batches and sums losses for context parallelism; over a group of one rank it changes nothing.

    Args:
        cp_mesh (DeviceMesh | None): the 1-D context-parallel mesh (``mesh["cp"]`` of
            :func:`tune.training.init_device_mesh`); None for a run without context parallelism.
        ignore_index (int): the label of the positions added to make the sequence length a multiple of
            ``2 x size``. Default -100.
    """

    def __init__(self, cp_mesh: Any = None, ignore_index: int = -100) -> None:
        self.size = 1 if cp_mesh is None else cp_mesh.size()
        self.group = cp_mesh.get_group() if self.size > 1 else None
        self.rank = cp_mesh.get_local_rank() if self.size > 1 else 0
        self.ignore_index = ignore_index

    @property
    def enabled(self) -> bool:
        """Whether the group has more than one rank."""
        return self.size > 1

    def shard(
        self, tokens: torch.Tensor, labels: torch.Tensor, inputs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """This rank's part of a batch: two chunks of every sequence, their labels, positions and attention mask.

        The sequence is first padded at the end to a multiple of ``2 x size`` (padding tokens are never attended by
        real ones and have no loss).

        Args:
            tokens (torch.Tensor): [b, S] token ids.
            labels (torch.Tensor): [b, S] labels, already shifted (``tune.modules.loss.shift_labels``): a chunk's last
                label is the next chunk's first token.
            inputs (dict[str, Any]): the model's other inputs (``tune.training.model_inputs``): ``mask`` [b, S, S]
                and ``input_pos`` [b, S] for packed or padding-free batches.

        Returns:
            tuple: tokens and labels [b, S'/size], and the model inputs: ``mask`` (a
            :class:`~tune.modules.ContextParallelMask`) and ``input_pos`` (the chunks' global positions).

        Raises:
            ValueError: for a model input that context parallelism cannot cut (images).
        """
        if not self.enabled:
            return tokens, labels, inputs
        unknown = sorted(set(inputs) - set(_SHARDED_INPUTS))
        if unknown:
            raise ValueError(
                f"context parallelism cuts text batches (tokens, labels, {', '.join(_SHARDED_INPUTS)}); this batch "
                f"also has {unknown}. Train it with context_parallel_dim: 1."
            )
        batch_size, seq_len = tokens.shape
        pad = -seq_len % (2 * self.size)
        padded_len = seq_len + pad
        positions = inputs.get("input_pos")
        if positions is None:
            positions = torch.arange(seq_len, device=tokens.device).expand(batch_size, seq_len)
        index = self._local_index(padded_len, tokens.device)
        mask = inputs.get("mask")
        rows = None if mask is None else _pad_mask(mask, pad).index_select(1, index)  # [b, 2C, S']
        return (
            F.pad(tokens, (0, pad)).index_select(1, index),
            F.pad(labels, (0, pad), value=self.ignore_index).index_select(1, index),
            {
                "mask": ContextParallelMask(self.group, padded_len, rows),
                "input_pos": F.pad(positions, (0, pad)).index_select(1, index),
            },
        )

    def _local_index(self, seq_len: int, device: torch.device) -> torch.Tensor:
        chunk_len = seq_len // (2 * self.size)
        starts = [chunk * chunk_len for chunk in load_balanced_chunks(self.rank, self.size)]
        return torch.cat([torch.arange(start, start + chunk_len, device=device) for start in starts])

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the group, differentiably: every rank gets the whole sequences' loss (or
        per-sequence sums) from its chunks' share; the gradient flows back to every rank's share."""
        if not self.enabled:
            return value
        return _SumOverGroup.apply(value, self.group)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) whose gradient is the sum of every rank's gradient: each rank uses the total, so each
    share of it feeds every rank's loss."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        total = value.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _pad_mask(mask: torch.Tensor, pad: int) -> torch.Tensor:
    """[b, S, S] -> [b, S + pad, S + pad]: padding positions attend only themselves, and no real one attends them."""
    if not pad:
        return mask
    seq_len = mask.shape[1]
    padded = F.pad(mask, (0, pad, 0, pad), value=False)
    padded[:, seq_len:, seq_len:] = torch.eye(pad, dtype=torch.bool, device=mask.device)
    return padded


def check_context_parallel(model: nn.Module, context_parallel_dim: int) -> None:
    """Refuses, in one line, a model that context parallelism cannot train exactly.

    Args:
        model (nn.Module): the model, as built (meta device is fine).
        context_parallel_dim (int): the ``cp`` group size; 1 checks nothing.

    Raises:
        ValueError: for a model that is not a text decoder, an attention layer with a sliding window, logit
            soft-capping, chunked attention or attention dropout, or mixture-of-experts layers.
    """
    if context_parallel_dim == 1:
        return
    if not isinstance(model, TransformerDecoder):
        raise ValueError(
            f"context parallelism trains text decoders (tune.modules.TransformerDecoder); this model is a "
            f"{type(model).__name__}. Set context_parallel_dim: 1."
        )
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            limits = {
                "sliding_window": module.sliding_window,
                "softcapping": module.softcapping,
                "attention_chunk_size": module.attention_chunk_size,
            }
            found = {key: value for key, value in limits.items() if value is not None}
            if module.attn_dropout:
                found["attn_dropout"] = module.attn_dropout
            if found:
                raise ValueError(
                    f"context parallelism computes plain causal (or masked) attention; {name} has {found}. Set "
                    "context_parallel_dim: 1 for this model."
                )
    if moe_layers(model):
        raise ValueError(
            "context parallelism does not support mixture-of-experts models yet (their routing statistics would "
            "cover one slice of each sequence). Set context_parallel_dim: 1."
        )
