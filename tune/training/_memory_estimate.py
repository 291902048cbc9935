"""How much memory a training run needs per device, computed from a model built on the meta device.

:func:`estimate_memory` adds up the terms of one training step (weights, gradients, optimizer state, activations,
loss buffers, frozen models, FSDP's gathered layers, a process baseline) from plain arguments: the model (on the
meta device, so nothing is allocated and no weights are read) and the run's settings. ``tune estimate`` reads those
settings from a config; the formulas are documented on :class:`MemoryEstimate` and in docs/memory_table.md.

Activations are not guessed from a formula per architecture: one transformer layer is run on the meta device
under ``torch.autograd.graph.saved_tensors_hooks`` at two sequence lengths, and the bytes it saves for backward
(parameters excluded, views counted once) give a per-token and a per-token-squared cost. Attention is counted as a
fused kernel that keeps its inputs, its output and one row statistic (what SDPA's flash and memory-efficient
kernels keep), not as the materialised score matrix that SDPA's meta fallback would trace.
"""

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import get_adapter_params

__all__ = [
    "CPU_ALLOCATOR_OVERHEAD",
    "CPU_PROCESS_BASELINE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "FrozenModel",
    "MemoryEstimate",
    "estimate_memory",
    "layer_activation_bytes",
    "optimizer_state_bytes",
    "parameter_bytes",
]

# Resident memory of a recipe process on CPU before its model exists: Python, torch, the tokenizer, `datasets`
# (pyarrow), the data loader. Measured with benchmarks/bench_estimate.py (peak RSS of a run minus every other
# term of its estimate, median over the calibration runs; see benchmarks/README.md).
CPU_PROCESS_BASELINE_BYTES = 440 * 2**20
# On CPU the resident set grows by about two thirds of what a step's layers would save for backward without
# activation checkpointing, with or without it: freed blocks the allocator keeps and the forward pass's
# temporaries. Not a tensor the estimate can name, so measured: the ratio fitted to the CPU runs of
# benchmarks/bench_estimate.py (0.65 to 0.70 on the larger ones). GPU peaks (max_memory_allocated) have no such term.
CPU_ALLOCATOR_OVERHEAD = 0.67
# What a CUDA context and torch's kernels take on the device besides the caching allocator's tensors (about 0.5 GiB
# on recent GPUs; it depends on the driver and the kernels loaded).
CUDA_CONTEXT_BYTES = 700 * 2**20

# optimizer class name (lower case) -> (states kept per trainable element, bytes per state element or None for the
# parameter's own dtype). torch keeps Adam's moments in the parameter's dtype; the 8-bit and 4-bit optimizers of
# bitsandbytes and torchao keep one or half a byte per element plus block scales (counted in _QUANTIZED_OVERHEAD).
_OPTIMIZER_STATES: dict[str, tuple[float, float | None]] = {
    "adamw": (2, None),
    "adam": (2, None),
    "nadam": (2, None),
    "radam": (2, None),
    "adamax": (2, None),
    "adagrad": (1, None),
    "rmsprop": (1, None),
    "adadelta": (2, None),
    "sgd": (0, None),
    "adamw8bit": (2, 1),
    "adam8bit": (2, 1),
    "pagedadamw8bit": (2, 1),
    "pagedadamw": (2, 4),
    "pagedadam": (2, 4),
    "adamw4bit": (2, 0.5),
    "adamwfp8": (2, 1),
    "lion": (1, None),
    "lion8bit": (1, 1),
}
# block scales of the quantised optimizers: one fp32 per block of 256 (torchao) or 2048 (bitsandbytes) elements
_QUANTIZED_OVERHEAD = 4 / 256


@dataclass(frozen=True)
class FrozenModel:
    """A model that runs without gradients next to the trained one: a DPO/KTO reference, a KD teacher, PPO's reward
    model and reference policy. Its weights stay resident; its forward passes keep nothing for backward.

    Args:
        name (str): what it is, for the report (``"reference"``, ``"teacher"``, ...).
        model (nn.Module): the model, on the meta device.
        num_sequences (int): sequences per forward pass.
        seq_len (int): tokens per sequence.
        logits (bool): whether its forward keeps ``[tokens, vocab]`` logits (a KD teacher's do).
    """

    name: str
    model: nn.Module
    num_sequences: int
    seq_len: int
    logits: bool = False


@dataclass
class MemoryEstimate:
    """Peak memory of a training run on each device, in bytes, term by term.

    ``terms`` holds what exists at the moment of the peak. The peak of a step is either at the end of the forward
    pass (weights, optimizer state, activations, the loss's buffers, and the gradients already made: all of them
    with gradient accumulation, else those the loss makes during forward) or after backward (weights, optimizer
    state, all gradients); ``phase`` says which. On CPU the checkpoint's state dict is held next to the model while
    it loads; ``load_peak`` is that moment and ``peak`` the larger of the two.

    Attributes:
        terms (dict[str, int]): bytes per device at the peak, by term.
        peak (int): the sum of ``terms`` (and at least ``load_peak``).
        phase (str): ``"forward"``, ``"after backward"`` or ``"checkpoint load"``.
        load_peak (int): bytes while the checkpoint loads (CPU runs; 0 on accelerators, whose state dicts load
            into host memory).
        host (dict[str, int]): bytes kept in host memory instead of the device (``fsdp_cpu_offload``).
        num_params (int): parameters of the trained model (all ranks).
        num_trainable (int): trainable parameters (all ranks).
        world_size (int): ranks; terms are per rank.
        shards (int): FSDP shards of the weights, gradients and optimizer state.
        tokens_per_device (int): tokens of one micro-batch on one device.
        device_memory (int | None): the device's memory, when known.
        notes (list[str]): assumptions and approximations worth knowing.
    """

    terms: dict[str, int]
    peak: int
    phase: str
    load_peak: int
    host: dict[str, int]
    num_params: int
    num_trainable: int
    world_size: int
    shards: int
    tokens_per_device: int
    device_memory: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        """Whether ``peak`` fits in ``device_memory`` (None when that is unknown)."""
        return None if self.device_memory is None else self.peak <= self.device_memory

    def as_dict(self) -> dict:
        """Plain types for JSON, with ``fits``."""
        return {**asdict(self), "fits": self.fits}


# ------------------------------------------------------------------------------------------------------ weights


def _tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds: an NF4 weight counts its 4-bit codes and its (double-quantised) block scales."""
    inner = getattr(tensor, "__tensor_flatten__", None)
    if inner is not None and type(tensor) not in (torch.Tensor, nn.Parameter):
        names, _ = inner()
        return sum(_tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def parameter_bytes(module: nn.Module, *, trainable_only: bool = False, buffers: bool = False) -> int:
    """Bytes of a module's parameters (each shared tensor once), as they are stored.

    Args:
        module (nn.Module): any module, on any device (meta included).
        trainable_only (bool): count only parameters with ``requires_grad``.
        buffers (bool): also count its buffers (RoPE caches, ...); never with ``trainable_only``.

    Returns:
        int: ``sum(numel * element_size)``; an NF4 (QLoRA) weight counts its codes and scales, about half a byte
        per element.
    """
    tensors = list(module.parameters())
    if trainable_only:
        tensors = [p for p in tensors if p.requires_grad]
    elif buffers:
        tensors += list(module.buffers())
    seen, total = set(), 0
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += _tensor_bytes(tensor)
    return total


def optimizer_state_bytes(optimizer: str, num_elements: int, param_itemsize: int, **kwargs: object) -> int:
    """Bytes of an optimizer's state for ``num_elements`` trainable elements.

    Args:
        optimizer (str): the class name or ``_component_`` path (``torch.optim.AdamW``, ``bitsandbytes.optim.
            PagedAdamW8bit``, ``torchao.optim.AdamW8bit``, ...). Unknown optimizers count as AdamW.
        num_elements (int): trainable elements.
        param_itemsize (int): bytes per element of the parameters (torch keeps the states in the same dtype).
        **kwargs: the optimizer's arguments; ``amsgrad``, ``momentum``, ``centered`` add states.

    Returns:
        int: bytes (the step counters, a few bytes per parameter tensor, are left out).
    """
    name = optimizer.rsplit(".", 1)[-1].lower()
    states, itemsize = _OPTIMIZER_STATES.get(name, _OPTIMIZER_STATES["adamw"])
    if kwargs.get("amsgrad"):
        states += 1
    if name == "sgd" and kwargs.get("momentum"):
        states = 1
    if name == "rmsprop":
        states += bool(kwargs.get("momentum")) + bool(kwargs.get("centered"))
    if itemsize is None:
        return int(states * num_elements * param_itemsize)
    return int(states * num_elements * (itemsize + _QUANTIZED_OVERHEAD))


# -------------------------------------------------------------------------------------------------- activations


class _FusedAttention(torch.autograd.Function):
    """Stands in for SDPA while tracing: keeps what a fused kernel keeps (q, k, v, output, one float per row)."""

    @staticmethod
    def forward(ctx, q, k, v):  # noqa: D102
        out = torch.empty_like(q)
        row_stats = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, row_stats)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 - never called: the trace does not run backward
        raise NotImplementedError


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _FusedAttention.apply(query, key, value)


@contextlib.contextmanager
def _fused_attention_while_tracing() -> Iterator[None]:
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _saved_bytes(layer: nn.Module, embed_dim: int, seq_len: int, dtype: torch.dtype) -> int:
    """Bytes one sequence of ``seq_len`` tokens makes ``layer`` save for backward (its input included)."""
    excluded = set()
    for tensor in [*layer.parameters(), *layer.buffers()]:
        with contextlib.suppress(Exception):
            excluded.add(tensor.untyped_storage()._cdata)
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
            key, size = storage._cdata, storage.nbytes()
        except Exception:  # noqa: BLE001 - tensor subclasses without one storage
            key, size = id(tensor), _tensor_bytes(tensor)
        if key not in excluded:
            saved[key] = size
        return tensor

    x = torch.empty(1, seq_len, embed_dim, device="meta", dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), _fused_attention_while_tracing():
        layer(x)
    return sum(saved.values())


def layer_activation_bytes(layer: nn.Module, embed_dim: int, dtype: torch.dtype) -> tuple[float, float]:
    """What a transformer layer saves for backward, as ``(bytes per token, bytes per token squared)``.

    The layer (on the meta device) is run on one sequence of 64 and one of 128 tokens; the two totals give the
    linear and the quadratic coefficient (the quadratic one is not 0 only where the layer materialises attention
    scores, as Gemma 2's soft-capping does).

    Args:
        layer (nn.Module): one layer, called as ``layer(x)`` with ``x`` of shape ``[1, s, embed_dim]``.
        embed_dim (int): the width of its input.
        dtype (torch.dtype): the activations' dtype.

    Returns:
        tuple[float, float]: ``(a, c)`` with bytes(s) = a * s + c * s**2 for one sequence of s tokens.
    """
    short, long = 64, 128
    bytes_short = _saved_bytes(layer, embed_dim, short, dtype)
    bytes_long = _saved_bytes(layer, embed_dim, long, dtype)
    # a*s + c*s^2 through both points
    quadratic = max(0.0, (bytes_long / long - bytes_short / short) / (long - short))
    linear = bytes_short / short - quadratic * short
    return linear, quadratic


def _layers(model: nn.Module) -> Sequence[nn.Module]:
    for path in ("layers", "decoder.layers", "model.layers"):
        module = model
        for name in path.split("."):
            module = getattr(module, name, None)
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0:
            return list(module)
    return []


def _embed_dim(model: nn.Module) -> int:
    embeddings = getattr(model, "tok_embeddings", None) or getattr(
        getattr(model, "decoder", None), "tok_embeddings", None
    )
    if embeddings is not None and hasattr(embeddings, "embedding_dim"):
        return embeddings.embedding_dim
    return getattr(embeddings, "weight", torch.empty(0, 0)).shape[-1]


def _vocab_size(model: nn.Module) -> int:
    output = getattr(model, "output", None) or getattr(getattr(model, "decoder", None), "output", None)
    weight = getattr(output, "weight", None)
    if weight is None:
        tied = getattr(output, "tied_module", None)
        weight = getattr(tied, "weight", None)
    return int(weight.shape[0]) if weight is not None else 0


@dataclass
class _ActivationModel:
    per_layer: list[tuple[float, float]]  # (bytes per token, bytes per token squared) of each layer
    embed_dim: int
    vocab_size: int
    traced: bool


def _activation_model(model: nn.Module, dtype: torch.dtype, notes: list[str]) -> _ActivationModel:
    layers, embed_dim = _layers(model), _embed_dim(model)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    per_layer: list[tuple[float, float]] = []
    cache: dict[tuple, tuple[float, float]] = {}
    traced = True
    for layer in layers:
        key = (type(layer), tuple((n, tuple(p.shape), p.requires_grad) for n, p in layer.named_parameters()))
        if key not in cache:
            try:
                cache[key] = layer_activation_bytes(layer, embed_dim, dtype)
            except Exception as err:  # noqa: BLE001 - data-dependent layers (routed experts) cannot run on meta
                traced = False
                hidden = _largest_out_features(layer)
                # a dense layer keeps about 6 embed-widths and 4 MLP-widths per token (norms, q/k/v, attention
                # output, residual; the MLP's gate, up, activation and product)
                cache[key] = ((6 * embed_dim + 4 * hidden) * itemsize, 0.0)
                notes.append(
                    f"activations of {type(layer).__name__} approximated (it could not run on the meta device: "
                    f"{type(err).__name__})"
                )
        per_layer.append(cache[key])
    return _ActivationModel(per_layer, embed_dim, _vocab_size(model), traced)


def _largest_out_features(layer: nn.Module) -> int:
    sizes = [m.weight.shape[0] for m in layer.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)]
    sizes = [s for s in sizes if s > 1]
    return max(sizes, default=0)


def _sequence_bytes(coefficients: tuple[float, float], seq_len: int) -> float:
    linear, quadratic = coefficients
    return linear * seq_len + quadratic * seq_len**2


# ------------------------------------------------------------------------------------------------------ estimate


def estimate_memory(
    model: nn.Module,
    *,
    batch_size: int,
    seq_len: int,
    trainable: str = "all",
    optimizer: str = "torch.optim.AdamW",
    optimizer_kwargs: dict | None = None,
    optimizer_in_bwd: bool = False,
    gradient_accumulation_steps: int = 1,
    activation_checkpointing: bool = False,
    activation_offloading: bool = False,
    loss: str = "linear",
    num_output_chunks: int = 8,
    sequences_per_sample: int = 1,
    world_size: int = 1,
    tensor_parallel_dim: int = 1,
    context_parallel_dim: int = 1,
    fsdp_cpu_offload: bool = False,
    fsdp_reshard_after_forward: bool = True,
    frozen_models: Sequence[FrozenModel] = (),
    trainable_models: Sequence[nn.Module] = (),
    kv_cache_bytes: int = 0,
    device_type: str = "cuda",
    baseline_bytes: int = 0,
    device_memory: int | None = None,
    checkpoint_load: bool | None = None,
) -> MemoryEstimate:
    """Estimates the peak memory per device of training ``model``.

    Args:
        model (nn.Module): the trained model, built on the meta device in the run's dtype.
        batch_size (int): sequences per micro-batch on one data-parallel rank.
        seq_len (int): tokens per sequence (``tokenizer.max_seq_len``: padded batches are at most that long).
        trainable (str): ``"all"`` (full fine-tuning) or ``"adapters"`` (LoRA/QLoRA/DoRA: only adapter weights;
            the other parameters of ``model`` are frozen in place, as the LoRA recipes do).
        optimizer (str): the optimizer's class name or path (see :func:`optimizer_state_bytes`).
        optimizer_kwargs (dict | None): its arguments (``amsgrad``, ``momentum``, ...).
        optimizer_in_bwd (bool): each parameter is stepped and its gradient freed during backward.
        gradient_accumulation_steps (int): micro-batches per step; above 1 the gradients exist during forward.
        activation_checkpointing (bool): each layer keeps only its input; backward recomputes one layer at a time.
        activation_offloading (bool): saved activations move to host memory (accelerators only).
        loss (str): ``"linear"`` (``LinearCrossEntropyLoss``: one chunk of fp32 logits at a time), ``"chunked"``
            (``CEWithChunkedOutputLoss``: model-dtype logits kept, fp32 a chunk at a time), ``"full"`` (full logits
            and their fp32 copy), ``"none"`` (a classifier head: no vocabulary logits).
        num_output_chunks (int): chunks of the chunked losses.
        sequences_per_sample (int): sequences a sample puts through the model (2 for preference pairs).
        world_size (int): ranks.
        tensor_parallel_dim (int): ranks of a tensor-parallel group (shard each layer's weights and heads).
        context_parallel_dim (int): ranks that split each sequence.
        fsdp_cpu_offload (bool): sharded weights, gradients and optimizer state live in host memory.
        fsdp_reshard_after_forward (bool): False keeps every gathered layer from forward to backward.
        frozen_models (Sequence[FrozenModel]): references, teachers, reward models.
        trainable_models (Sequence[nn.Module]): other trained models (PPO's value model), same settings.
        kv_cache_bytes (int): a generation KV cache (GRPO/PPO), per device.
        device_type (str): ``"cuda"``, ``"cpu"``, ...: on CPU activation offloading has no effect and the
            checkpoint's state dict is counted while it loads.
        baseline_bytes (int): the process or context baseline (:data:`CPU_PROCESS_BASELINE_BYTES`,
            :data:`CUDA_CONTEXT_BYTES`, or 0).
        device_memory (int | None): the device's memory, for :attr:`MemoryEstimate.fits`.
        checkpoint_load (bool | None): count the state dict held while the checkpoint loads; None: on CPU.

    Returns:
        MemoryEstimate: the terms per device and the peak.

    Raises:
        ValueError: for a world size the parallel dimensions do not divide, or an unknown ``trainable``/``loss``.
    """
    if trainable not in ("all", "adapters"):
        raise ValueError(f"trainable must be 'all' or 'adapters', got {trainable!r}")
    if loss not in ("linear", "chunked", "full", "none"):
        raise ValueError(f"loss must be one of linear, chunked, full, none; got {loss!r}")
    if world_size % (tensor_parallel_dim * context_parallel_dim):
        raise ValueError(
            f"world size {world_size} is not a multiple of tensor_parallel_dim x context_parallel_dim "
            f"({tensor_parallel_dim} x {context_parallel_dim})"
        )
    notes: list[str] = []
    shards = world_size  # FSDP over dp_shard x cp, tensor parallel splits what is left: every rank holds 1/world
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    optimizer_kwargs = optimizer_kwargs or {}

    trained = [model, *trainable_models]
    if trainable == "adapters":
        adapters = get_adapter_params(model)
        if not adapters:
            raise ValueError("trainable='adapters' but the model has no adapter parameters (LoRA/DoRA layers)")
        trainable_params = list(adapters.values())
        # frozen as the LoRA recipes freeze them: a frozen linear layer keeps no input for its weight's gradient
        adapter_ids = {id(p) for p in trainable_params}
        for param in model.parameters():
            if id(param) not in adapter_ids:
                param.requires_grad_(False)
    else:
        trainable_params = list(model.parameters())
    for other in trainable_models:
        trainable_params += list(other.parameters())
    num_trainable = sum(p.numel() for p in {id(p): p for p in trainable_params}.values())
    trainable_bytes = sum(_tensor_bytes(p) for p in {id(p): p for p in trainable_params}.values())
    weight_bytes = sum(parameter_bytes(m, buffers=True) for m in trained)
    grad_bytes = trainable_bytes
    if optimizer_in_bwd:  # one gradient at a time: stepped and freed by its hook
        grad_bytes = max((_tensor_bytes(p) for p in trainable_params), default=0) * shards
    state_bytes = optimizer_state_bytes(optimizer, num_trainable, itemsize, **optimizer_kwargs)

    # activations of one micro-batch on one device
    sequences = batch_size * sequences_per_sample
    local_seq = math.ceil(seq_len / context_parallel_dim)
    tokens = sequences * local_seq
    activations, head_bytes, early_grads, tied, uncheckpointed = 0.0, 0.0, 0, False, 0.0
    for trained_model in trained:
        act = _activation_model(trained_model, dtype, notes)
        layer_bytes = [sequences * _sequence_bytes(c, local_seq) / tensor_parallel_dim for c in act.per_layer]
        uncheckpointed += sum(layer_bytes)
        recompute = 0.0
        if activation_checkpointing and layer_bytes:
            # each layer keeps its input; backward recomputes one layer's activations at a time
            recompute = max(layer_bytes)
            activations += len(layer_bytes) * tokens * act.embed_dim * itemsize + recompute
        else:
            activations += sum(layer_bytes)
        activations += 2 * tokens * act.embed_dim * itemsize  # the final norm's input and output
        if trained_model is model:
            kept, working, early_grads = _loss_bytes(model, act, loss, tokens, num_output_chunks, itemsize, trainable)
            # a chunk of logits lives during forward, a recomputed layer during backward: never both
            head_bytes += kept + max(0.0, working - recompute)
            tied = early_grads > 0 and _output_is_tied(model)
    if activation_offloading and device_type != "cpu":
        # only what a layer computes with stays on the device; the rest waits in pinned host memory
        offloaded = activations
        activations = max(
            (sequences * _sequence_bytes(c, local_seq) for c in _activation_model(model, dtype, notes).per_layer),
            default=0,
        )
        notes.append(f"activation offloading: {_gib(offloaded - activations)} of activations in host memory")
    elif activation_offloading:
        notes.append("activation offloading has no effect on CPU (activations are in host memory already)")

    frozen_weights, frozen_work = _frozen_terms(frozen_models, dtype, context_parallel_dim, notes)

    terms: dict[str, int] = {}
    host: dict[str, int] = {}
    sharded = {
        "weights": weight_bytes // shards,
        "gradients": grad_bytes // shards,
        "optimizer state": state_bytes // shards,
    }
    if frozen_weights:
        sharded["frozen models"] = frozen_weights // shards
    gathered = 0
    if world_size > 1:
        # FSDP all-gathers one layer (and prefetches the next) at a time, or keeps every gathered layer
        layer_sizes = [parameter_bytes(layer) for m in trained for layer in _layers(m)] or [0]
        if fsdp_reshard_after_forward:
            gathered = 2 * max(layer_sizes) // tensor_parallel_dim
        else:
            gathered = sum(layer_sizes) // tensor_parallel_dim
    if fsdp_cpu_offload and world_size > 1:
        host = dict(sharded)
        sharded = {}
        notes.append("fsdp_cpu_offload: sharded weights, gradients and optimizer state in host memory")
    terms.update(sharded)
    if gathered:
        terms["gathered layers (FSDP)"] = gathered
    terms["activations"] = int(activations)
    terms["loss and logits"] = int(head_bytes)
    if frozen_work:
        terms["frozen models' forward"] = frozen_work
    if kv_cache_bytes:
        terms["generation KV cache"] = kv_cache_bytes
    if baseline_bytes:
        terms["baseline"] = baseline_bytes
    if device_type == "cpu":
        terms["allocator overhead (CPU)"] = int(CPU_ALLOCATOR_OVERHEAD * uncheckpointed)

    forward_grads = early_grads // shards
    phase = _peak_phase(terms, forward_grads, tied, gradient_accumulation_steps > 1 or optimizer_in_bwd)
    peak = sum(terms.values())

    if checkpoint_load is None:
        checkpoint_load = device_type == "cpu"
    load_peak = 0
    if checkpoint_load:
        # next to the built model, the checkpointer holds the state dict read from the file and, while it converts
        # it (keys, dtype, NF4), up to two more dense copies: measured on CPU, the load peaks at the model plus
        # three times its dense weights (benchmarks/README.md, "Memory estimate vs measured")
        dense = sum(p.numel() for p in model.parameters()) * itemsize
        load_peak = terms.get("weights", 0) + terms.get("frozen models", 0) + 3 * dense // shards + baseline_bytes
        if load_peak > peak:
            phase, peak = "checkpoint load", load_peak
    return MemoryEstimate(
        terms=terms,
        peak=peak,
        phase=phase,
        load_peak=load_peak,
        host=host,
        num_params=sum(p.numel() for m in trained for p in m.parameters()),
        num_trainable=num_trainable,
        world_size=world_size,
        shards=shards,
        tokens_per_device=tokens,
        device_memory=device_memory,
        notes=notes,
    )


def _frozen_terms(
    frozen_models: Sequence[FrozenModel], dtype: torch.dtype, context_parallel_dim: int, notes: list[str]
) -> tuple[int, int]:
    """Frozen models' weights, and the largest working set of their forward passes without gradients (one
    layer's activations, plus a teacher's logits, which stay until the loss)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    weights, work = 0, 0
    for frozen in frozen_models:
        weights += parameter_bytes(frozen.model, buffers=True)
        act = _activation_model(frozen.model, dtype, notes)
        seq_len = math.ceil(frozen.seq_len / context_parallel_dim)
        layer = max((frozen.num_sequences * _sequence_bytes(c, seq_len) for c in act.per_layer), default=0)
        logits = frozen.num_sequences * seq_len * act.vocab_size * itemsize if frozen.logits else 0
        work = max(work, int(layer + logits))
    return weights, work


def _peak_phase(terms: dict[str, int], early_grads: int, tied: bool, grads_during_forward: bool) -> str:
    """Keeps in ``terms`` what exists at the peak of a step and says when that is.

    At the end of forward: activations, loss buffers and the gradients that exist then (all of them with gradient
    accumulation or ``optimizer_in_bwd``, else those the loss made during forward). After backward: all gradients
    and no activations; with a tied output weight, the loss's gradient of it is added to the embedding's own at the
    end of backward, so both exist for a moment.
    """
    grads = terms.get("gradients", 0)
    forward_grads = grads if grads_during_forward else min(grads, early_grads)
    forward_side = terms["activations"] + terms["loss and logits"] + forward_grads
    backward_side = grads + (min(grads, early_grads) if tied else 0)
    if forward_side >= backward_side:
        if "gradients" in terms:
            terms["gradients"] = forward_grads
        return "forward"
    terms["activations"], terms["loss and logits"] = 0, 0
    if "gradients" in terms:
        terms["gradients"] = backward_side
    return "after backward"


def _loss_bytes(
    model: nn.Module,
    act: _ActivationModel,
    loss: str,
    tokens: int,
    num_output_chunks: int,
    itemsize: int,
    trainable: str,
) -> tuple[int, int, int]:
    """The loss's memory at the end of forward: (bytes kept until backward, bytes of its working set while one
    chunk is scored, bytes of gradients it makes during forward)."""
    vocab, embed_dim = act.vocab_size, act.embed_dim
    if loss == "none" or vocab == 0:
        return 0, 0, 0
    # one chunk's logits in the model's dtype (when narrower than fp32), their fp32 log-softmax and its gradient
    per_logit = 8 + (itemsize if itemsize < 4 else 0)
    if loss == "linear":
        # LinearCrossEntropyLoss: chunks of at least 32 MiB of fp32 logits; the hidden states' gradient (and the
        # output weight's, when trained) are made during forward and kept for backward
        min_rows = max(1, (32 * 2**20) // (4 * vocab))
        num_chunks = max(1, min(num_output_chunks, -(-tokens // min_rows)))
        rows = -(-tokens // num_chunks)
        weight = getattr(getattr(model, "output", None), "weight", None)
        trained_output = trainable == "all" and weight is not None and weight.requires_grad
        early = vocab * embed_dim * itemsize if trained_output else 0
        return tokens * embed_dim * itemsize, rows * vocab * per_logit, early
    rows = -(-tokens // max(1, num_output_chunks))
    if loss == "chunked":  # logits kept in the model's dtype, upcast a chunk at a time
        return tokens * vocab * itemsize, rows * vocab * per_logit, 0
    return tokens * vocab * itemsize, tokens * vocab * per_logit, 0  # the whole logit matrix at once


def _output_is_tied(model: nn.Module) -> bool:
    output, embeddings = getattr(model, "output", None), getattr(model, "tok_embeddings", None)
    weight = getattr(output, "weight", None)
    return weight is not None and weight is getattr(embeddings, "weight", None)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
