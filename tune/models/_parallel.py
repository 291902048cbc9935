"""Tensor-parallel plans of the decoder families (Megatron-LM layout, Shoeybi et al., 2019,
https://arxiv.org/abs/1909.08053).

A plan maps module names (``*`` matches one name component) to ``torch.distributed.tensor.parallel`` styles.
In every transformer layer the projections that fan out (``q_proj``, ``k_proj``, ``v_proj``, ``w1``, ``w3``) are
split by output features (``ColwiseParallel``: each rank computes whole heads, or a slice of the MLP's hidden
units) and the projections that fan in (``output_proj``, ``w2``) by input features (``RowwiseParallel``: the
partial sums are all-reduced), so a layer costs two all-reduces forward and two backward. QKV biases (Qwen2.5)
are split with their projection's output features. RoPE and the layer norms see whole hidden states and stay
as they are.

Qwen3's ``q_norm``/``k_norm`` normalise each head over ``head_dim``, so their forward needs no communication,
but their one weight is shared by all heads: a rank holding half of the heads computes half of its gradient.
The plan marks them ``SequenceParallel(sequence_dim=2)``: the weight becomes a replicated DTensor and the
queries/keys a DTensor split on the head dimension, so the weight's gradient comes out as a partial sum that is
all-reduced over the tensor-parallel ranks (by FSDP2 when it reduces the gradients).

An untied vocabulary embedding is split by vocabulary rows and the output projection by vocabulary columns,
whose logits are gathered so that any loss (the chunked one too, which calls ``model.output`` itself) sees
whole rows. A tied output (``TiedLinear``) shares the embedding's weight, so both stay whole.

Attention reshapes with its own head counts; :func:`tune.training.apply_tensor_parallel` sets them to the
per-rank counts when it applies a plan. ``torch.distributed`` is imported when a plan is built, never when a
family is imported.
"""

from typing import Any

from torch import nn


def _decoder_tp_plan(model: nn.Module | None) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    plan: dict[str, Any] = {
        "layers.*.attn.q_proj": ColwiseParallel(),
        "layers.*.attn.k_proj": ColwiseParallel(),
        "layers.*.attn.v_proj": ColwiseParallel(),
        "layers.*.attn.output_proj": RowwiseParallel(),
        "layers.*.mlp.w1": ColwiseParallel(),
        "layers.*.mlp.w3": ColwiseParallel(),
        "layers.*.mlp.w2": RowwiseParallel(),
    }
    if model is not None and getattr(model.layers[0].attn, "q_norm", None) is not None:
        # q/k [b, s, heads, head_dim] arrive split by heads (dim 2); the shared weight's gradient is summed
        plan["layers.*.attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["layers.*.attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    untied = model is None or isinstance(getattr(model, "output", None), nn.Linear)
    if untied:
        # tokens arrive whole on every rank; each rank looks up its vocabulary rows and the rows are summed
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate())
        # each rank computes the logits of its vocabulary slice; they are gathered to whole rows for the loss
        plan["output"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def base_llama_tp_plan(model: nn.Module | None = None) -> dict[str, Any]:
    """The tensor-parallel plan of the Llama-structured decoders (Llama 2, 3, 3.1, 3.2, 3.3, Mistral).

    Args:
        model (nn.Module | None): the decoder the plan is for; a tied output projection (Llama 3.2 1B/3B) keeps
            the embedding and output whole. ``None`` assumes an untied ``nn.Linear`` output (8B and up), as in a
            config that names the plan without a model (``tensor_parallel_plan: {_component_: ...}``).

    Returns:
        dict[str, Any]: module name patterns to ``ColwiseParallel``/``RowwiseParallel`` styles, for
        ``tune.training.apply_tensor_parallel`` (or ``torch.distributed.tensor.parallel.parallelize_module``
        followed by setting the attention modules' per-rank head counts).
    """
    return _decoder_tp_plan(model)


def base_qwen_tp_plan(model: nn.Module) -> dict[str, Any]:
    """The tensor-parallel plan of Qwen2.5 and Qwen3.

    The layout is Llama's: Qwen2.5's q/k/v biases are split with their projections' output features, and
    Qwen3's per-head ``q_norm``/``k_norm`` get a replicated weight whose gradient is summed over the ranks (see
    the module docstring).

    Args:
        model (nn.Module): the decoder (the plan depends on whether it has ``q_norm``/``k_norm`` and a tied
            output: Qwen2.5 up to 3B and Qwen3 up to 4B tie it, which keeps the embedding and output whole).

    Returns:
        dict[str, Any]: module name patterns to parallel styles (see :func:`base_llama_tp_plan`).
    """
    return _decoder_tp_plan(model)
