"""Llama 4 (text) component builders: the language model of Llama 4 Scout and Maverick.

A Llama 4 decoder differs from Llama 3 in three ways (Meta, 2025, https://ai.meta.com/blog/llama-4-multimodal-intelligence/;
transformers' ``modeling_llama4.py``):

- **Attention.** Every ``no_rope_layer_interval``-th layer (the 4th, 8th, ...) has no position embedding ("NoPE")
  and attends the whole causal context; its queries are scaled by ``1 + attn_scale * log(1 + floor((p + 1) /
  floor_scale))`` at position ``p`` (attention temperature tuning; Nakanishi, 2025,
  https://arxiv.org/abs/2501.19399). The other layers use RoPE (Llama 3 scaling on Scout), attend only within
  chunks of ``attention_chunk_size`` positions, and normalise queries and keys per head by their root mean square
  without a learned scale (``use_qk_norm``, Scout only).
- **Mixture of experts.** The layers in ``moe_layers`` (every ``interleave_moe_layer_step``-th: all of Scout's,
  every second of Maverick's) hold an ``MoE`` block: a router choosing ``experts_per_token`` experts by logit, whose
  weight ``sigmoid(logit)`` multiplies the token BEFORE the expert (``expert(w * x)``), and a shared SwiGLU expert of
  the experts' width seeing every token, added. The other layers hold a dense SwiGLU network of width
  ``intermediate_dim`` (Hugging Face's ``intermediate_size_mlp``).
- **RoPE layout.** tune's RoPE rotates halves; Llama 4's checkpoints rotate interleaved pairs, so the converter
  permutes the rows of ``q_proj`` and ``k_proj`` (``_convert_weights``).

Keys: ``layers.N.mlp.router.gate.weight``, ``layers.N.mlp.experts.{gate_proj,up_proj,down_proj}``
(``[num_experts, out, in]``) and ``layers.N.mlp.shared_expert.{w1,w2,w3}.weight`` in sparse layers,
``layers.N.mlp.{w1,w2,w3}.weight`` in dense ones; attention as in Llama (the norms have no weights).
"""

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tune.models._common import LORA_TAIL, LoRASpec, build_decoder, lora_builder
from tune.modules import FeedForward, Llama3ScaledRoPE, RotaryPositionalEmbeddings, TransformerDecoder
from tune.modules.moe import MoE, SwiGLUExperts, TopKRouter
from tune.modules.peft import DoRALinear, LoRALinear, LoRASwiGLUExperts


class Llama4QKNorm(nn.Module):
    """Normalises each head's features by their root mean square, without a learned scale (Llama 4's
    ``use_qk_norm``; transformers calls it ``Llama4TextL2Norm``). Computed in float32, returned in the input dtype.

    Args:
        eps (float): added to the mean square. Default 1e-5.
    """

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., head_dim] -> the same shape and dtype."""
        x_fp32 = x.float()
        return (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class Llama4QueryTemperature(nn.Module):
    """Scales queries at position ``p`` by ``1 + attn_scale * log(1 + floor((p + 1) / floor_scale))``: Llama 4's
    attention temperature tuning on its NoPE layers (Nakanishi, 2025, https://arxiv.org/abs/2501.19399), which
    sharpens attention over long contexts and is exactly 1 for the first ``floor_scale - 1`` positions.

    Args:
        floor_scale (int): positions per step of the scale (8192 in the releases).
        attn_scale (float): strength of the scaling (0.1 in the releases).
    """

    def __init__(self, floor_scale: int, attn_scale: float) -> None:
        super().__init__()
        if floor_scale < 1:
            raise ValueError(f"floor_scale must be a positive number of positions, got {floor_scale}.")
        self.floor_scale = floor_scale
        self.attn_scale = attn_scale

    def forward(self, q: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Scales ``q`` [b, s, num_heads, head_dim] by its positions ``input_pos`` [b, s] (None: ``0..s-1``)."""
        if input_pos is None:
            input_pos = torch.arange(q.shape[1], device=q.device)[None]
        steps = torch.floor((input_pos.float() + 1.0) / self.floor_scale)
        scale = torch.log1p(steps) * self.attn_scale + 1.0  # [b or 1, s]
        return (q * scale[:, :, None, None]).to(q.dtype)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"


class _ComputedRoPE:
    """RoPE whose cosines and sines are computed from the positions at each call instead of read from a table.

    Llama 4's context (10M positions for Scout, 1M for Maverick) would make the cosine and sine tables of
    ``RotaryPositionalEmbeddings`` 10.7 GB (Scout, float32); the angles ``position * inv_freq`` computed on the fly
    are the same float32 numbers the table holds. ``inv_freq`` (``dim / 2`` values) is a non-persistent buffer
    recomputed in float32 whenever the module is moved or cast, so ``model.to(torch.bfloat16)`` keeps it exact.
    """

    def reset_parameters(self) -> None:
        """(Re)computes ``inv_freq``, e.g. after building on the meta device and ``to_empty``."""
        device = self.inv_freq.device
        if device.type != "meta":
            self._buffers["inv_freq"] = self.inverse_frequencies().to(device)

    rope_init = reset_parameters

    def _init_frequencies(self, dim: int, max_seq_len: int, base: float) -> None:
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got dim={dim}.")
        self.dim, self.max_seq_len, self.base = dim, max_seq_len, base
        self.register_buffer("inv_freq", torch.empty(dim // 2), persistent=False)
        self.reset_parameters()

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self.reset_parameters()  # float32 on the new device, whatever dtype the move asked for
        return module

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Rotates ``x`` [b, s, num_heads, dim] by its positions ``input_pos`` [b, s] (None: ``0..s-1``)."""
        positions = torch.arange(x.shape[1], device=x.device)[None] if input_pos is None else input_pos
        angles = positions.float()[..., None] * self.inv_freq.float()  # [b or 1, s, dim // 2]
        angles = torch.cat((angles, angles), dim=-1)[:, :, None]  # [b or 1, s, 1, dim]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        half = self.dim // 2  # rotate_half(x) * sin, as RotaryPositionalEmbeddings writes it
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return x * cos + x.roll(half, dims=-1) * signed_sin


class Llama4RoPE(_ComputedRoPE, RotaryPositionalEmbeddings):
    """Unscaled RoPE computed at each call (Maverick; see ``_ComputedRoPE``).

    Args:
        dim (int): rotated features per head.
        max_seq_len (int): the longest sequence the model supports (recorded; no table is built).
        base (float): the RoPE theta.
    """

    def __init__(self, dim: int, max_seq_len: int, base: float) -> None:
        nn.Module.__init__(self)  # not RotaryPositionalEmbeddings.__init__, which allocates the tables
        self._init_frequencies(dim, max_seq_len, base)


class Llama4ScaledRoPE(_ComputedRoPE, Llama3ScaledRoPE):
    """``Llama3ScaledRoPE``'s frequencies computed at each call (Scout; see ``_ComputedRoPE``).

    Args:
        dim (int): rotated features per head.
        max_seq_len (int): the longest sequence the model supports (recorded; no table is built).
        base (float): the RoPE theta.
        scale_factor (float): divisor of the low frequencies (16 on Scout).
        low_freq_factor (float): Llama 3 scaling's ``low_freq_factor``.
        high_freq_factor (float): its ``high_freq_factor`` (not smaller than ``low_freq_factor``).
        old_context_len (int): its ``original_max_position_embeddings``.

    Raises:
        ValueError: if ``high_freq_factor < low_freq_factor``.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int,
        base: float,
        scale_factor: float,
        low_freq_factor: float,
        high_freq_factor: float,
        old_context_len: int,
    ) -> None:
        nn.Module.__init__(self)  # not Llama3ScaledRoPE.__init__, which allocates the tables
        if high_freq_factor < low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({high_freq_factor}) must not be smaller than low_freq_factor ({low_freq_factor})."
            )
        self.scale_factor = scale_factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.old_context_len = old_context_len
        self._init_frequencies(dim, max_seq_len, base)


def llama4(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    intermediate_dim: int,
    moe_intermediate_dim: int,
    num_experts: int,
    experts_per_token: int = 1,
    interleave_moe_layer_step: int = 1,
    moe_layers: Sequence[int] | None = None,
    head_dim: int | None = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 500_000.0,
    rope_scale_factor: float | None = None,
    rope_low_freq_factor: float = 1.0,
    rope_high_freq_factor: float = 1.0,
    rope_old_context_len: int = 8192,
    use_qk_norm: bool = True,
    no_rope_layer_interval: int = 4,
    no_rope_layers: Sequence[int] | None = None,
    attention_chunk_size: int | None = 8192,
    attn_temperature_tuning: bool = True,
    floor_scale: int = 8192,
    attn_scale: float = 0.1,
    tie_word_embeddings: bool = False,
    use_grouped_mm: bool = False,
) -> TransformerDecoder:
    """A Llama 4 language model (the layer structure is in the module docstring).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        intermediate_dim (int): hidden width of the dense layers (``intermediate_size_mlp``).
        moe_intermediate_dim (int): hidden width of each expert and of the shared expert (``intermediate_size``).
        num_experts (int): routed experts per sparse layer (``num_local_experts``).
        experts_per_token (int): experts each token is routed to (``num_experts_per_tok``). Default 1.
        interleave_moe_layer_step (int): every this many layers is sparse, the last of each group. Default 1.
        moe_layers (Sequence[int] | None): the sparse layers' indices, overriding the step. Default None.
        head_dim (int | None): features per head. Default embed_dim // num_heads.
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon (also the q/k norm's). Default 1e-5.
        rope_base (float): RoPE theta. Default 500000.
        rope_scale_factor (float | None): Llama 3 RoPE scaling's factor (``Llama3ScaledRoPE``; 16 on Scout); None
            for unscaled RoPE (Maverick). Default None.
        rope_low_freq_factor (float): its ``low_freq_factor``. Default 1.
        rope_high_freq_factor (float): its ``high_freq_factor``. Default 1.
        rope_old_context_len (int): its ``original_max_position_embeddings``. Default 8192.
        use_qk_norm (bool): normalise queries and keys on the RoPE layers. Default True.
        no_rope_layer_interval (int): every this many layers has no RoPE, the last of each group. Default 4.
        no_rope_layers (Sequence[int] | None): the NoPE layers' indices, overriding the interval. Default None.
        attention_chunk_size (int | None): the RoPE layers' attention chunk; None for full attention. Default 8192.
        attn_temperature_tuning (bool): scale the NoPE layers' queries by position. Default True.
        floor_scale (int): positions per step of that scale. Default 8192.
        attn_scale (float): strength of that scale. Default 0.1.
        tie_word_embeddings (bool): the output projection reuses the token embeddings. Default False.
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` instead of a loop. Default False.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for a layer index outside the model, or non-positive steps.
    """
    return _build(**locals(), lora=None, lora_experts=False, lora_router=False)


@lora_builder(llama4, tail=(*LORA_TAIL, "apply_lora_to_experts", "apply_lora_to_router"))
def lora_llama4(
    lora: LoRASpec, *, apply_lora_to_experts: bool, apply_lora_to_router: bool, **dims: Any
) -> TransformerDecoder:
    """:func:`llama4` with LoRA (or DoRA, or QLoRA) layers, as :func:`tune.models.qwen3_moe.lora_qwen3_moe` does.

    With ``quantize_base`` every routed expert's weights are stored in NF4, adapted or not; the router is never
    quantised.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the dense layers' and the shared experts' projections. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim,
            moe_intermediate_dim, num_experts, experts_per_token, interleave_moe_layer_step, moe_layers, head_dim,
            attn_dropout, norm_eps, rope_base, rope_scale_factor, rope_low_freq_factor, rope_high_freq_factor,
            rope_old_context_len, use_qk_norm, no_rope_layer_interval, no_rope_layers,
            attention_chunk_size, attn_temperature_tuning, floor_scale, attn_scale, tie_word_embeddings,
            use_grouped_mm: as in :func:`llama4`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input (linear layers only). Default 0.0.
        use_dora (bool): DoRA instead of LoRA on the linear layers (not on experts). Default False.
        quantize_base (bool): NF4 base weights (QLoRA). Default False.
        apply_lora_to_experts (bool): a LoRA update per routed expert (``LoRASwiGLUExperts``; merge with
            ``tune.modules.peft.merge_lora_experts`` before writing a checkpoint). Default False.
        apply_lora_to_router (bool): adapt the router's gate. Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, LoRA on a tied output, or DoRA on experts.
    """
    if lora.use_dora and apply_lora_to_experts:
        raise ValueError("use_dora=True is not implemented for the experts; set apply_lora_to_experts=False.")
    return _build(**dims, lora=lora, lora_experts=apply_lora_to_experts, lora_router=apply_lora_to_router)


def _layer_flags(num_layers: int, step: int, explicit: Sequence[int] | None, what: str) -> list[bool]:
    """Per layer, whether it is one of ``explicit`` (when given) or the last of each group of ``step`` layers.

    Raises:
        ValueError: for a step below 1 or an index outside the model, naming ``what``.
    """
    if explicit is None:
        if step < 1:
            raise ValueError(f"the {what} step must be >= 1, got {step}.")
        return [(i + 1) % step == 0 for i in range(num_layers)]
    outside = sorted(i for i in explicit if not 0 <= i < num_layers)
    if outside:
        raise ValueError(f"{what} {outside} are outside the model's {num_layers} layers.")
    chosen = set(explicit)
    return [i in chosen for i in range(num_layers)]


def _build(*, lora: LoRASpec | None, lora_experts: bool, lora_router: bool, **dims) -> TransformerDecoder:
    num_layers = dims["num_layers"]
    sparse = _layer_flags(num_layers, dims["interleave_moe_layer_step"], dims["moe_layers"], "moe_layers")
    nope = _layer_flags(num_layers, dims["no_rope_layer_interval"], dims["no_rope_layers"], "no_rope_layers")
    # The shared assembly builds Llama attention with a width-1 feed-forward and a one-position RoPE table; each
    # layer is then given its Llama 4 attention settings, the RoPE computed on the fly (one module shared by the
    # RoPE layers), the model's max_seq_len and its real feed-forward block.
    max_seq_len = dims["max_seq_len"]
    model = build_decoder(
        vocab_size=dims["vocab_size"],
        num_layers=num_layers,
        num_heads=dims["num_heads"],
        num_kv_heads=dims["num_kv_heads"],
        embed_dim=dims["embed_dim"],
        intermediate_dim=1,
        max_seq_len=1,
        head_dim=dims["head_dim"],
        attn_dropout=dims["attn_dropout"],
        norm_eps=dims["norm_eps"],
        tie_word_embeddings=dims["tie_word_embeddings"],
        lora=lora,
    )
    model.max_seq_len = max_seq_len
    rope = _rope(model.head_dim, max_seq_len, dims)
    for layer, is_sparse, is_nope in zip(model.layers, sparse, nope, strict=True):
        attn = layer.attn
        attn.max_seq_len = max_seq_len
        attn.pos_embeddings = None if is_nope else rope
        if is_nope:  # full causal attention without position embedding, queries scaled by position
            if dims["attn_temperature_tuning"]:
                attn.query_scaling = Llama4QueryTemperature(dims["floor_scale"], dims["attn_scale"])
        else:
            attn.attention_chunk_size = dims["attention_chunk_size"]
            if dims["use_qk_norm"]:
                # tune normalises before RoPE, transformers after: a rotation keeps the root mean square, so the
                # two orders agree
                attn.q_norm, attn.k_norm = Llama4QKNorm(dims["norm_eps"]), Llama4QKNorm(dims["norm_eps"])
        if is_sparse:
            layer.mlp = _moe_block(dims, lora, lora_experts, lora_router)
        else:
            layer.mlp = _feed_forward(dims["embed_dim"], dims["intermediate_dim"], lora)
    return model


def _rope(head_dim: int, max_seq_len: int, dims: dict) -> RotaryPositionalEmbeddings:
    if dims["rope_scale_factor"] is None:
        return Llama4RoPE(head_dim, max_seq_len, dims["rope_base"])
    return Llama4ScaledRoPE(
        head_dim,
        max_seq_len,
        dims["rope_base"],
        scale_factor=dims["rope_scale_factor"],
        low_freq_factor=dims["rope_low_freq_factor"],
        high_freq_factor=dims["rope_high_freq_factor"],
        old_context_len=dims["rope_old_context_len"],
    )


def _linear(in_dim: int, out_dim: int, lora: LoRASpec | None, adapted: bool) -> nn.Module:
    if lora is None or not adapted:
        return nn.Linear(in_dim, out_dim, bias=False)
    cls = DoRALinear if lora.use_dora else LoRALinear
    return cls(
        in_dim, out_dim, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, quantize_base=lora.quantize_base
    )


def _feed_forward(embed_dim: int, hidden_dim: int, lora: LoRASpec | None) -> FeedForward:
    adapted = lora is not None and lora.apply_to_mlp
    return FeedForward(
        gate_proj=_linear(embed_dim, hidden_dim, lora, adapted),
        down_proj=_linear(hidden_dim, embed_dim, lora, adapted),
        up_proj=_linear(embed_dim, hidden_dim, lora, adapted),
    )


def _moe_block(dims: dict, lora: LoRASpec | None, lora_experts: bool, lora_router: bool) -> MoE:
    embed_dim, hidden_dim, num_experts = dims["embed_dim"], dims["moe_intermediate_dim"], dims["num_experts"]
    quantize = lora is not None and lora.quantize_base
    if lora is not None and lora_experts:
        experts: SwiGLUExperts = LoRASwiGLUExperts(
            embed_dim,
            hidden_dim,
            num_experts,
            rank=lora.rank,
            alpha=lora.alpha,
            use_grouped_mm=dims["use_grouped_mm"],
            quantize_base=quantize,
        )
        experts.weight_inputs = True
    else:
        experts = SwiGLUExperts(
            embed_dim,
            hidden_dim,
            num_experts,
            use_grouped_mm=dims["use_grouped_mm"],
            quantize_base=quantize,
            weight_inputs=True,
        )
    gate = nn.Linear(embed_dim, num_experts, bias=False)
    if lora is not None and lora_router:
        gate = LoRALinear(embed_dim, num_experts, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
    router = TopKRouter(gate, num_experts, dims["experts_per_token"], norm_topk_prob=False, score_func="sigmoid")
    return MoE(experts=experts, router=router, shared_expert=_feed_forward(embed_dim, hidden_dim, lora))
