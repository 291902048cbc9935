"""The decoder assembly every family's component builders share.

Families differ in a handful of switches (QKV bias, q/k norm, tied output, RoPE scaling, sliding windows,
soft-capping, Gemma's norms); one function wires them so that a fix lands in every family at once. Families
expose their own component builders with torchtune's keyword names and call this.

Also here: ``ModelSize``, a row of the table of released sizes each family keeps in its ``_model_builders.py``;
``qlora_builder``, which makes a family's ``qlora_*`` builders from its ``lora_*`` ones; ``llama_intermediate_dim``
(the Llama builders' default feed-forward width); ``inst_template`` (the ``[INST]`` text of Llama 2's and Mistral's
chat templates) and ``check_torchtune_bpe_options`` (torchtune's Qwen tokenizer options tune accepts).
"""

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from tune.data import Message
from tune.modules import (
    FeedForward,
    Llama3ScaledRoPE,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TiedLinear,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)
from tune.modules.peft import DoRALinear, LoRALinear

LORA_ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")


@dataclass(frozen=True)
class LoRASpec:
    """Where and how LoRA is applied; built from a LoRA builder's keyword arguments by ``lora_spec``."""

    attn_modules: tuple[str, ...]
    apply_to_mlp: bool
    apply_to_output: bool
    rank: int
    alpha: float
    dropout: float
    use_dora: bool
    quantize_base: bool


def lora_spec(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> LoRASpec:
    """Checks LoRA builder arguments and packs them.

    Raises:
        ValueError: for a module name outside ``q_proj, k_proj, v_proj, output_proj``.
    """
    if isinstance(lora_attn_modules, str):
        lora_attn_modules = [lora_attn_modules]
    unknown = sorted(set(lora_attn_modules) - set(LORA_ATTN_MODULES))
    if unknown:
        raise ValueError(f"lora_attn_modules has unknown module(s) {unknown}; choose from {list(LORA_ATTN_MODULES)}.")
    return LoRASpec(
        tuple(lora_attn_modules),
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base,
    )


def _linear(in_dim: int, out_dim: int, *, bias: bool, adapted: bool, lora: LoRASpec | None) -> nn.Module:
    if lora is None or not adapted:
        return nn.Linear(in_dim, out_dim, bias=bias)
    cls = DoRALinear if lora.use_dora else LoRALinear
    return cls(
        in_dim,
        out_dim,
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        use_bias=bias,
        quantize_base=lora.quantize_base,
    )


def _rope(head_dim: int, max_seq_len: int, rope_base: float, rope_scaling: dict | None) -> nn.Module:
    if rope_scaling is None:
        return RotaryPositionalEmbeddings(head_dim, max_seq_len=max_seq_len, base=rope_base)
    return Llama3ScaledRoPE(head_dim, max_seq_len=max_seq_len, base=rope_base, **rope_scaling)


def build_decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: int | None = None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    rope_scaling: dict | None = None,
    tie_word_embeddings: bool = False,
    q_proj_bias: bool = False,
    k_proj_bias: bool = False,
    v_proj_bias: bool = False,
    qk_norm: bool = False,
    sliding_windows: Sequence[int | None] | None = None,
    attn_scale: float | None = None,
    attn_softcapping: float | None = None,
    final_softcapping: float | None = None,
    gemma_norms: bool = False,
    activation: str = "silu",
    embed_scale: float | None = None,
    lora: LoRASpec | None = None,
    output_dim: int | None = None,
) -> TransformerDecoder:
    """Assembles a decoder from family switches (see the family component builders for their meaning).

    ``gemma_norms`` selects Gemma's ``(1 + weight)`` RMSNorm and the extra post-attention and post-feed-forward
    norms; ``rope_scaling`` holds ``Llama3ScaledRoPE`` arguments; ``sliding_windows`` one entry per layer;
    ``output_dim`` the width of an untied output projection (default ``vocab_size``; ``num_classes`` for a
    classifier or reward model, whose output then scores every position).

    Raises:
        ValueError: for inconsistent sizes or LoRA on a tied output.
    """
    if head_dim is None:
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) is not divisible by num_heads ({num_heads}); pass head_dim.")
        head_dim = embed_dim // num_heads
    sliding_windows = list(sliding_windows) if sliding_windows is not None else [None] * num_layers
    if len(sliding_windows) != num_layers:
        raise ValueError(f"sliding_windows has {len(sliding_windows)} entries for {num_layers} layers.")
    if output_dim is not None and tie_word_embeddings:
        raise ValueError(f"output_dim={output_dim} needs an untied output projection; set tie_word_embeddings=False.")
    if lora is not None and lora.apply_to_output and tie_word_embeddings:
        raise ValueError(
            "apply_lora_to_output=True needs an untied output projection, but this model ties it to the token "
            "embeddings; set apply_lora_to_output=False."
        )
    rope = _rope(head_dim, max_seq_len, rope_base, rope_scaling)  # shared by all layers: one cos/sin table
    layers = [
        _layer(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_dim=intermediate_dim,
            max_seq_len=max_seq_len,
            attn_dropout=attn_dropout,
            norm_eps=norm_eps,
            biases=(q_proj_bias, k_proj_bias, v_proj_bias),
            qk_norm=qk_norm,
            sliding_window=window,
            attn_scale=attn_scale,
            attn_softcapping=attn_softcapping,
            gemma_norms=gemma_norms,
            activation=activation,
            rope=rope,
            lora=lora,
        )
        for window in sliding_windows
    ]
    tok_embeddings = nn.Embedding(vocab_size, embed_dim)
    if tie_word_embeddings:
        output = TiedLinear(tok_embeddings, softcapping=final_softcapping)
    else:
        if final_softcapping is not None:
            raise ValueError("final_softcapping is only implemented for tied output embeddings (Gemma).")
        adapted = lora is not None and lora.apply_to_output
        output = _linear(embed_dim, output_dim or vocab_size, bias=False, adapted=adapted, lora=lora)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=RMSNorm(embed_dim, eps=norm_eps, add_unit_offset=gemma_norms),
        output=output,
        embed_scale=embed_scale,
    )


def _layer(
    *,
    embed_dim: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float,
    norm_eps: float,
    biases: tuple[bool, bool, bool],
    qk_norm: bool,
    sliding_window: int | None,
    attn_scale: float | None,
    attn_softcapping: float | None,
    gemma_norms: bool,
    activation: str,
    rope: nn.Module,
    lora: LoRASpec | None,
) -> TransformerSelfAttentionLayer:
    targets = set(lora.attn_modules) if lora is not None else set()
    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim

    def norm(dim: int) -> RMSNorm:
        return RMSNorm(dim, eps=norm_eps, add_unit_offset=gemma_norms)

    attn = MultiHeadAttention(
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_proj=_linear(embed_dim, q_dim, bias=biases[0], adapted="q_proj" in targets, lora=lora),
        k_proj=_linear(embed_dim, kv_dim, bias=biases[1], adapted="k_proj" in targets, lora=lora),
        v_proj=_linear(embed_dim, kv_dim, bias=biases[2], adapted="v_proj" in targets, lora=lora),
        output_proj=_linear(q_dim, embed_dim, bias=False, adapted="output_proj" in targets, lora=lora),
        pos_embeddings=rope,
        q_norm=norm(head_dim) if qk_norm else None,
        k_norm=norm(head_dim) if qk_norm else None,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        scale=attn_scale,
        sliding_window=sliding_window,
        softcapping=attn_softcapping,
    )
    on_mlp = lora is not None and lora.apply_to_mlp
    mlp = FeedForward(
        gate_proj=_linear(embed_dim, intermediate_dim, bias=False, adapted=on_mlp, lora=lora),
        down_proj=_linear(intermediate_dim, embed_dim, bias=False, adapted=on_mlp, lora=lora),
        up_proj=_linear(embed_dim, intermediate_dim, bias=False, adapted=on_mlp, lora=lora),
        activation=_activation(activation),
    )
    return TransformerSelfAttentionLayer(
        attn,
        mlp,
        sa_norm=norm(embed_dim),
        mlp_norm=norm(embed_dim),
        sa_scale=norm(embed_dim) if gemma_norms else None,
        mlp_scale=norm(embed_dim) if gemma_norms else None,
    )


def _activation(name: str) -> nn.Module:
    if name == "silu":
        return nn.SiLU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    raise ValueError(f"Unknown activation {name!r}; supported: 'silu', 'gelu_tanh'.")


def llama_intermediate_dim(embed_dim: int, multiple_of: int = 256) -> int:
    """The feed-forward width of a Llama builder called without ``intermediate_dim``.

    A SwiGLU feed-forward has three matrices where a plain MLP of width ``4 * embed_dim`` has two, so Llama takes
    two thirds of that width (the same parameter count), rounded up to a multiple of ``multiple_of``
    (Touvron et al., 2023, https://arxiv.org/abs/2302.13971, section 2.2). torchtune's builders compute the same.

    Args:
        embed_dim (int): model width.
        multiple_of (int): the width is rounded up to a multiple of this. Default 256.

    Returns:
        int: the feed-forward hidden width.
    """
    width = 4 * int(2 * embed_dim / 3)
    return -(-width // multiple_of) * multiple_of


@dataclass(frozen=True)
class ModelSize:
    """A released model size: a row of a family's ``MODEL_SIZES`` table, keyed by the name of its builder.

    The table drives the family's named builders (``qwen2(**MODEL_SIZES["qwen2_5_0_5b"].dims)``),
    ``tools/make_configs.py`` (which downloads ``repo``) and the tests of named sizes (which compare the built
    model with the published ``config.json`` of ``repo``).

    Args:
        repo (str): the Hugging Face repo id whose ``config.json`` the dimensions are those of.
        dims (Mapping[str, Any]): keyword arguments of the family's component builder; stored read-only.
    """

    repo: str
    dims: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", MappingProxyType(dict(self.dims)))  # frozen all the way down


def qlora_builder(lora_builder: Callable[..., Any]) -> functools.partial:
    """``lora_builder`` with ``quantize_base=True``, named ``q<lora_builder's name>`` and documented.

    The partial reads like a function: ``__name__``, ``__qualname__``, ``__module__`` and ``__doc__`` are set, and
    ``inspect.signature`` (what ``tune validate`` checks config keys against) gives the LoRA builder's parameters
    as ``functools.partial`` makes them: ``quantize_base`` keyword-only with default True, and the parameters after
    it keyword-only too (torchtune's ``qlora_*`` builders are such partials and take the same arguments).

    Args:
        lora_builder (Callable[..., Any]): a family's ``lora_<size>`` builder, with a ``quantize_base`` parameter.

    Returns:
        functools.partial: the ``qlora_<size>`` builder.

    Raises:
        TypeError: if ``lora_builder`` has no ``quantize_base`` parameter.
    """
    signature = inspect.signature(lora_builder)
    if "quantize_base" not in signature.parameters:
        raise TypeError(f"{lora_builder.__name__} has no quantize_base parameter to fix to True.")
    builder = functools.partial(lora_builder, quantize_base=True)
    builder.__name__ = builder.__qualname__ = f"q{lora_builder.__name__}"
    builder.__module__ = lora_builder.__module__
    builder.__doc__ = (
        f":func:`{lora_builder.__name__}` with ``quantize_base=True`` (QLoRA, Dettmers et al., 2023,\n"
        "https://arxiv.org/abs/2305.14314): the base weights of the adapted layers are stored in NF4. It takes the\n"
        "same arguments; those from ``quantize_base`` on are keyword-only.\n"
    )
    builder.__signature__ = inspect.signature(builder)  # what functools.partial gives, fixed once
    return builder


def inst_template(messages: list[Message], system_tags: tuple[str, str]) -> list[Message]:
    """The ``[INST]`` text layout of Llama 2 and Mistral, as a prompt template's call.

    Each user turn becomes ``"[INST] {text} [/INST] "``; a system message is dropped and its text, wrapped in
    ``system_tags``, opens the first user turn after it (the layout of the families' Hugging Face chat templates).
    Other turns are left as they are.

    Args:
        messages (list[Message]): one conversation.
        system_tags (tuple[str, str]): text before and after the system prompt inside the user turn.

    Returns:
        list[Message]: the templated conversation (the input messages are not changed).
    """
    out, system = [], ""
    for message in messages:
        if message.role == "system":
            system = f"{system_tags[0]}{message.text_content}{system_tags[1]}"
            continue
        if message.role == "user":
            parts = [{"type": "text", "content": f"[INST] {system}"}, *message.content]
            parts.append({"type": "text", "content": " [/INST] "})
            message = Message("user", parts, masked=message.masked, ipython=message.ipython, eot=message.eot)
            system = ""
        out.append(message)
    return out


def check_torchtune_bpe_options(options: dict[str, Any]) -> None:
    """Accepts the keyword options of torchtune's Qwen tokenizers that tune's tokenizer already behaves as.

    Raises:
        ValueError: for any other option or value, naming it.
    """
    options = dict(options)
    options.pop("bpe_cache_size", None)  # a speed setting of torchtune's BPE: nothing to set here
    if options.get("errors", "replace") == "replace":
        options.pop("errors", None)
    if options:
        raise ValueError(
            f"Unsupported tokenizer option(s) {sorted(options)}: tune's Qwen tokenizers take their special tokens "
            "from tokenizer.json and decode invalid UTF-8 with errors='replace'; remove these arguments."
        )
