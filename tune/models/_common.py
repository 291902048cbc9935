"""The decoder assembly every family's component builders share.

Families differ in a handful of switches (QKV bias, q/k norm, tied output, RoPE scaling, sliding windows,
soft-capping, Gemma's norms); one function wires them so that a fix lands in every family at once. Families
expose their own component builders with torchtune's keyword names and call this.

Also here: ``ModelSize``, a row of the table of released sizes each family keeps in its ``_model_builders.py``;
``lora_builder``, which gives a family's ``lora_<family>`` component builder its signature (the base builder's plus
the LoRA arguments); ``lora_size_builder`` and ``qlora_builder``, which make the ``lora_*`` and ``qlora_*`` builders
of a named size from the base one and the table; ``llama_intermediate_dim``
(the Llama builders' default feed-forward width); and ``check_torchtune_bpe_options`` (torchtune's Qwen tokenizer
options tune accepts).
"""

import functools
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

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
from tune.modules.peft import DoRALinear, LoRALinear, get_adapter_params

LORA_ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")
_POSITIONAL_OR_KEYWORD, _KEYWORD_ONLY = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY


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


# Every LoRA builder argument as torchtune's builders annotate and default it: lora_spec's eight, and the two that
# only the mixture-of-experts families take.
_LORA_PARAMETERS: dict[str, inspect.Parameter] = {
    **inspect.signature(lora_spec).parameters,
    "apply_lora_to_experts": inspect.Parameter("apply_lora_to_experts", _KEYWORD_ONLY, default=False, annotation=bool),
    "apply_lora_to_router": inspect.Parameter("apply_lora_to_router", _KEYWORD_ONLY, default=False, annotation=bool),
}
_SPEC_NAMES = tuple(inspect.signature(lora_spec).parameters)

# Where torchtune's lora_<family> builders put the LoRA arguments: these first (positional or keyword), then the
# base builder's arguments (keyword-only), then these (keyword-only).
LORA_HEAD = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output")
LORA_TAIL = ("lora_rank", "lora_alpha", "lora_dropout", "use_dora", "quantize_base")


def lora_builder(
    base: Callable[..., Any],
    *,
    head: Sequence[str] = LORA_HEAD,
    tail: Sequence[str] = LORA_TAIL,
    regroup: Sequence[str] = (),
    required: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the decorated function becomes the LoRA builder of ``base``, with torchtune's signature for it.

    The signature is ``head`` (positional or keyword), then every parameter of ``base`` (keyword-only), then
    ``tail`` (keyword-only), returning what ``base`` returns. A LoRA argument takes its annotation and default from
    :func:`lora_spec` (``apply_lora_to_experts`` and ``apply_lora_to_router``: ``bool = False``); a name of
    ``base``'s in ``tail`` moves that parameter there. ``regroup`` names parameters of ``base`` that stand, in that
    order, where the first of them stands in ``base``; ``required`` names LoRA arguments without a default.

    The decorated function receives ``lora`` (the :class:`LoRASpec` of :func:`lora_spec`'s eight arguments, checked)
    and every other argument by keyword; its name, module and docstring are the builder's.

    Args:
        base (Callable[..., Any]): the family's base component builder (``llama2``).
        head (Sequence[str]): LoRA arguments before the base ones. Default ``LORA_HEAD``.
        tail (Sequence[str]): arguments after the base ones. Default ``LORA_TAIL``.
        regroup (Sequence[str]): base arguments in the order the LoRA builder lists them. Default none.
        required (Sequence[str]): LoRA arguments without a default. Default none.

    Returns:
        Callable[[Callable[..., Any]], Callable[..., Any]]: the decorator.

    Raises:
        ValueError: if the names do not give each of :func:`lora_spec`'s arguments and ``base``'s exactly once.
    """
    base_signature = inspect.signature(base)
    base_params = base_signature.parameters

    def lora_param(name: str) -> inspect.Parameter:
        param = _LORA_PARAMETERS[name]
        return param.replace(default=inspect.Parameter.empty) if name in required else param

    middle = [param for name, param in base_params.items() if name not in tail]
    if regroup:
        start = min([param.name for param in middle].index(name) for name in regroup)
        rest = [param for param in middle if param.name not in regroup]
        middle = rest[:start] + [base_params[name] for name in regroup] + rest[start:]
    params = [lora_param(name).replace(kind=_POSITIONAL_OR_KEYWORD) for name in head]
    params += [param.replace(kind=_KEYWORD_ONLY) for param in middle]
    params += [(base_params.get(name) or lora_param(name)).replace(kind=_KEYWORD_ONLY) for name in tail]
    signature = inspect.Signature(params, return_annotation=base_signature.return_annotation)
    names = [param.name for param in params]
    if len(set(names)) != len(names) or not set(base_params) | set(_SPEC_NAMES) <= set(names):
        raise ValueError(f"{base.__name__}'s LoRA builder would have the parameters {names}.")

    def decorate(body: Callable[..., Any]) -> Callable[..., Any]:
        def builder(*args: Any, **kwargs: Any) -> Any:
            arguments = _bind(builder, signature, args, kwargs)
            spec = lora_spec(**{name: arguments.pop(name) for name in _SPEC_NAMES})
            return body(lora=spec, **arguments)

        return _named(builder, body.__name__, body.__module__, body.__doc__, signature)

    return decorate


def _bind(builder: Callable[..., Any], signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call by name, defaults filled in, as Python would bind them to ``signature``."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(f"{builder.__name__}(): {error}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _named(
    builder: Callable[..., Any], name: str, module: str, doc: str | None, signature: inspect.Signature
) -> Callable[..., Any]:
    # What inspect.signature, help() and the family registry read: the builder reads like a written function.
    builder.__name__ = builder.__qualname__ = name
    builder.__module__ = module
    builder.__doc__ = doc
    builder.__signature__ = signature
    # what typing.get_type_hints reads (the config checks among its callers)
    builder.__annotations__ = {
        p.name: p.annotation for p in signature.parameters.values() if p.annotation is not p.empty
    }
    if signature.return_annotation is not signature.empty:
        builder.__annotations__["return"] = signature.return_annotation
    return builder


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


def lora_size_builder(
    base: Callable[..., Any],
    lora_component: Callable[..., Any],
    sizes: Mapping[str, ModelSize] | None = None,
    *,
    dims: Callable[..., Mapping[str, Any]] | None = None,
    lora_names: Sequence[str] | None = None,
) -> Callable[..., Any]:
    """The ``lora_<size>`` builder of a named size: ``lora_component`` at the dimensions the size builder ``base`` has.

    Its parameters: the LoRA arguments of ``lora_component`` in that builder's order (or ``lora_names``, where
    torchtune's size builder lists others), positional or keyword with :func:`lora_spec`'s defaults; then the
    parameters of ``base`` itself (``tie_word_embeddings``, ``use_grouped_mm``, ``hf_config_path``). A call passes
    its LoRA arguments and ``dims(**base's arguments)`` to ``lora_component``; without ``dims``, the dimensions are the
    row of ``sizes`` named like ``base``, updated with ``base``'s arguments. Name, module and a docstring are set.

    Args:
        base (Callable[..., Any]): the size's builder without adapters (``llama3_2_1b``).
        lora_component (Callable[..., Any]): the family's LoRA component builder (``lora_llama3_2``).
        sizes (Mapping[str, ModelSize] | None): the family's ``MODEL_SIZES``. Default None: ``dims`` is given.
        dims (Callable[..., Mapping[str, Any]] | None): the keyword arguments of ``lora_component`` other than the
            LoRA ones, from ``base``'s arguments; for a size built otherwise than from its row. Default None.
        lora_names (Sequence[str] | None): the LoRA arguments in this builder's order. Default None.

    Returns:
        Callable[..., Any]: the ``lora_<base name>`` builder.

    Raises:
        TypeError: unless exactly one of ``sizes`` and ``dims`` is given.
    """
    if (sizes is None) == (dims is None):
        raise TypeError(f"lora_size_builder({base.__name__}): pass the size table or a dims function, not both.")
    row = sizes[base.__name__] if sizes is not None else None

    def row_dims(**extra: Any) -> Mapping[str, Any]:
        return {**row.dims, **extra}

    make_dims = dims or row_dims
    lora_signature = inspect.signature(lora_component)
    if lora_names is None:
        lora_names = [name for name in lora_signature.parameters if name in _LORA_PARAMETERS]
    own = inspect.signature(base).parameters
    params = [_LORA_PARAMETERS[name].replace(kind=_POSITIONAL_OR_KEYWORD) for name in lora_names]
    signature = inspect.Signature([*params, *own.values()], return_annotation=lora_signature.return_annotation)

    def builder(*args: Any, **kwargs: Any) -> Any:
        arguments = _bind(builder, signature, args, kwargs)
        extra = {name: arguments.pop(name) for name in own}
        return lora_component(**arguments, **make_dims(**extra))

    family = lora_component.__module__.rpartition(".")[0]
    lora_ref = f":func:`~{family}.{lora_component.__name__}`"
    where = f"at the dimensions of ``{row.repo}``" if row is not None else "at this size"
    args = [f"{', '.join(lora_names)}: as in {lora_ref}."]
    if own:
        args.append(f"{', '.join(own)}: as in :func:`{base.__name__}`.")
    wrap = functools.partial(textwrap.fill, width=116, break_on_hyphens=False, break_long_words=False)
    doc = "\n".join(
        [
            wrap(f":func:`{base.__name__}` with fresh LoRA adapters: {lora_ref} {where}."),
            "\nArgs:",
            *(wrap(arg, initial_indent=" " * 4, subsequent_indent=" " * 8) for arg in args),
            "\nReturns:\n    TransformerDecoder: the model; only adapter parameters are meant to be trained.\n",
        ]
    )
    return _named(builder, f"lora_{base.__name__}", base.__module__, doc, signature)


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


# What a vision-language LoRA builder can make of each part (decoder, encoder, fusion): torchtune's choices.
TRAINABLE_CHOICES = ("frozen", "lora", "full")


def trainable_choice(name: str, value: Any) -> str:
    """A LoRA builder's choice for one part (``decoder_trainable=...``), lower-cased.

    Raises:
        ValueError: naming the argument, for a value outside :data:`TRAINABLE_CHOICES`.
    """
    choice = value.lower() if isinstance(value, str) else value
    if choice not in TRAINABLE_CHOICES:
        raise ValueError(f"{name} must be one of {list(TRAINABLE_CHOICES)}, got {value!r}.")
    return choice


def set_part_trainable(part: nn.Module, choice: "str | bool") -> None:
    """``requires_grad`` for one part of a model: True or ``"full"`` every parameter, ``"lora"`` its adapters only,
    False or ``"frozen"`` none."""
    adapters = set(get_adapter_params(part)) if choice == "lora" else set()
    for name, param in part.named_parameters():
        param.requires_grad_(choice in (True, "full") or name in adapters)
