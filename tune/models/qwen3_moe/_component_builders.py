"""Qwen3-MoE component builders: Qwen3's attention with mixture-of-experts feed-forward blocks.

A layer is sparse (an ``MoE`` block: softmax top-k router and stacked SwiGLU experts, no shared expert) or dense
(a ``FeedForward`` of width ``intermediate_dim``) as ``moe_layer_pattern`` says from ``decoder_sparse_step`` and
``mlp_only_layers``; the released sizes are sparse in every layer. Keys: ``layers.N.mlp.router.gate.weight``
and ``layers.N.mlp.experts.{gate_proj,up_proj,down_proj}`` (``[num_experts, out, in]``) in sparse layers,
``layers.N.mlp.w1/w2/w3.weight`` in dense ones.
"""

from collections.abc import Sequence
from typing import Any

from torch import nn

from tune.models._common import LORA_TAIL, LoRASpec, build_decoder, lora_builder
from tune.modules import FeedForward, TransformerDecoder
from tune.modules.moe import MoE, SwiGLUExperts, TopKRouter, moe_layer_pattern
from tune.modules.peft import DoRALinear, LoRALinear, LoRASwiGLUExperts


def qwen3_moe(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    intermediate_dim: int,
    moe_intermediate_dim: int,
    num_experts: int,
    experts_per_token: int,
    norm_topk_prob: bool = True,
    decoder_sparse_step: int = 1,
    mlp_only_layers: Sequence[int] = (),
    attn_dropout: float = 0.0,
    head_dim: int | None = None,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    sliding_windows: Sequence[int | None] | None = None,
    use_grouped_mm: bool = False,
) -> TransformerDecoder:
    """A Qwen3-MoE decoder (Qwen Team, 2025, https://arxiv.org/abs/2505.09388).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        intermediate_dim (int): hidden width of the dense layers' feed-forward (``intermediate_size``).
        moe_intermediate_dim (int): hidden width of each expert (``moe_intermediate_size``).
        num_experts (int): experts per sparse layer.
        experts_per_token (int): experts each token is routed to (``num_experts_per_tok``).
        norm_topk_prob (bool): renormalise the top-k router weights to sum to 1. Default True.
        decoder_sparse_step (int): every this many layers is sparse. Default 1.
        mlp_only_layers (Sequence[int]): layers that are dense whatever the step. Default none.
        attn_dropout (float): attention dropout. Default 0.0.
        head_dim (int | None): features per head (128 in the released sizes). Default embed_dim // num_heads.
        norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_base (float): RoPE theta. Default 1e6.
        tie_word_embeddings (bool): the output projection reuses the token embeddings. Default False.
        sliding_windows (Sequence[int | None] | None): per-layer sliding window. Default None: full attention.
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` instead of a loop. Default False.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _build(**locals(), lora=None, lora_experts=False, lora_router=False)


@lora_builder(qwen3_moe, tail=(*LORA_TAIL, "apply_lora_to_experts", "apply_lora_to_router"))
def lora_qwen3_moe(
    lora: LoRASpec, *, apply_lora_to_experts: bool, apply_lora_to_router: bool, **dims: Any
) -> TransformerDecoder:
    """:func:`qwen3_moe` with LoRA (or DoRA, or QLoRA) layers.

    With ``quantize_base`` every expert weight is stored in NF4, adapted or not (the experts are nearly all of
    the parameters), besides the base weights of the adapted linear layers. The router is never quantised.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the dense layers' feed-forward projections. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim,
            moe_intermediate_dim, num_experts, experts_per_token, norm_topk_prob, decoder_sparse_step,
            mlp_only_layers, attn_dropout, head_dim, norm_eps, rope_base, tie_word_embeddings, sliding_windows,
            use_grouped_mm: as in :func:`qwen3_moe`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input (linear layers; expert adapters have none). Default 0.0.
        use_dora (bool): DoRA instead of LoRA on the linear layers (not on experts). Default False.
        quantize_base (bool): NF4 base weights (QLoRA). Default False.
        apply_lora_to_experts (bool): a LoRA update per expert on its three projections
            (``LoRASwiGLUExperts``). The checkpointers merge them into the experts of the Hugging Face output and,
            PEFT having no module to load them into, write them in tune's keys to
            ``adapter/expert_adapter.safetensors`` rather than ``adapter_model.safetensors``. Default False.
        apply_lora_to_router (bool): adapt the router's gate (merged into the checkpoint like any LoRA layer; its
            PEFT adapter does not load in PEFT, whose LoRA cannot wrap transformers' router). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, LoRA on a tied output, or DoRA on experts.
    """
    if lora.use_dora and apply_lora_to_experts:
        raise ValueError("use_dora=True is not implemented for the experts; set apply_lora_to_experts=False.")
    return _build(**dims, lora=lora, lora_experts=apply_lora_to_experts, lora_router=apply_lora_to_router)


def _build(*, lora, lora_experts: bool, lora_router: bool, **dims) -> TransformerDecoder:
    sparse = moe_layer_pattern(dims["num_layers"], dims["decoder_sparse_step"], dims["mlp_only_layers"])
    if dims["num_experts"] == 0:
        sparse = [False] * dims["num_layers"]
    # The shared assembly builds every layer's feed-forward at width 1; each is then replaced by the layer's real
    # block (so no full-size dense network is allocated for a sparse layer).
    model = build_decoder(
        vocab_size=dims["vocab_size"],
        num_layers=dims["num_layers"],
        num_heads=dims["num_heads"],
        num_kv_heads=dims["num_kv_heads"],
        embed_dim=dims["embed_dim"],
        intermediate_dim=1,
        max_seq_len=dims["max_seq_len"],
        attn_dropout=dims["attn_dropout"],
        norm_eps=dims["norm_eps"],
        rope_base=dims["rope_base"],
        head_dim=dims["head_dim"],
        tie_word_embeddings=dims["tie_word_embeddings"],
        qk_norm=True,
        sliding_windows=dims["sliding_windows"],
        lora=lora,
    )
    for layer, is_sparse in zip(model.layers, sparse, strict=True):
        if is_sparse:
            layer.mlp = _moe_block(dims, lora, lora_experts, lora_router)
        else:
            layer.mlp = _dense_block(dims["embed_dim"], dims["intermediate_dim"], lora)
    return model


def _linear(in_dim: int, out_dim: int, lora, adapted: bool) -> nn.Module:
    if lora is None or not adapted:
        return nn.Linear(in_dim, out_dim, bias=False)
    cls = DoRALinear if lora.use_dora else LoRALinear
    return cls(
        in_dim, out_dim, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, quantize_base=lora.quantize_base
    )


def _dense_block(embed_dim: int, hidden_dim: int, lora) -> FeedForward:
    adapted = lora is not None and lora.apply_to_mlp
    return FeedForward(
        gate_proj=_linear(embed_dim, hidden_dim, lora, adapted),
        down_proj=_linear(hidden_dim, embed_dim, lora, adapted),
        up_proj=_linear(embed_dim, hidden_dim, lora, adapted),
    )


def _moe_block(dims: dict, lora, lora_experts: bool, lora_router: bool) -> MoE:
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
    else:
        experts = SwiGLUExperts(
            embed_dim, hidden_dim, num_experts, use_grouped_mm=dims["use_grouped_mm"], quantize_base=quantize
        )
    gate = nn.Linear(embed_dim, num_experts, bias=False)
    if lora is not None and lora_router:
        gate = LoRALinear(embed_dim, num_experts, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
    router = TopKRouter(gate, num_experts, dims["experts_per_token"], norm_topk_prob=dims["norm_topk_prob"])
    return MoE(experts=experts, router=router)
