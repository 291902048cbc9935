"""Model converters: components that rewrite a built model before training (fake quantisation, float8, ...).

A recipe applies the converters listed under ``model_converters:`` in its config, in order, after the model is
built (and its weights loaded) and before it is sharded or handed to an optimizer; once the optimizer exists,
each converter's ``post_optimizer_hook`` runs after every optimizer step::

    converters = config.instantiate(cfg.model_converters) or []   # a list of `_component_` entries
    model = training.apply_model_converters(model, converters)
    ...                                                          # shard, build the optimizer
    training.register_post_optimizer_hooks(optimizer, model, converters)

Order rule. Each converter declares a ``kind``, the kinds that must run after it (``must_precede``), before it
(``must_follow``), or not at all beside it (``conflicts_with``); :func:`validate_converter_order` checks a list up
front and names both converters and the fix. The built-in kinds:

- ``"peft"`` (converters that wrap linear layers in adapters: :class:`LoRAConverter`, or one from a plugin) comes
  first: the QAT
  converter knows :class:`~tune.modules.peft.LoRALinear` and fake-quantises the merged weight the deployed model
  will hold, whereas an adapter wrapper running after it would meet torchao's ``FakeQuantizedLinear`` (an
  ``nn.Linear``) and silently drop its fake quantisers. LoRA built by a ``lora_*`` builder already exists when
  converters run, so QAT on a LoRA model needs no ordering at all.
- ``"qat"`` (fake quantisation) and ``"float8"`` (float8 matmuls) both replace ``nn.Linear`` layers with their
  own subclasses, so they cannot be combined; both declare ``must_follow = ("peft",)``.

Third-party converters (from ``tune.plugins`` entry points or any dotted path) that declare nothing have their
class name as kind and no constraints.
"""

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import DoRALinear, LoRALinear, apply_lora, is_nf4_tensor
from tune.utils import get_logger, import_optional

log = get_logger(name=__name__)

# float8 matmuls (torch._scaled_mm) need Ada (sm89) or newer.
_FLOAT8_MIN_CAPABILITY = (8, 9)
# torch._scaled_mm needs both matmul dimensions to be multiples of 16.
_FLOAT8_DIM_MULTIPLE = 16


@runtime_checkable
class ModelConverter(Protocol):
    """What a model converter provides; any class with these methods is one (no base class needed).

    Optional class attributes read by :func:`validate_converter_order`: ``kind`` (str, default the class name),
    ``must_precede`` (kinds that must come after this converter), ``must_follow`` (kinds that must come before
    it, e.g. ``("peft",)``) and ``conflicts_with`` (kinds that cannot be used together with it).
    """

    def convert(self, model: nn.Module) -> nn.Module:
        """Rewrites ``model`` (in place or not) and returns the model to train.

        Called after the model is built and its weights are loaded, before sharding and before the optimizer
        exists.
        """
        ...

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Runs after every optimizer step (e.g. to refresh cached scales). May do nothing."""
        ...


def converter_kind(converter: Any) -> str:
    """The ``kind`` a converter (instance or class) declares, or its class name when it declares none."""
    kind = getattr(converter, "kind", None)
    if kind is None:
        cls = converter if isinstance(converter, type) else type(converter)
        kind = cls.__name__
    return str(kind)


def _label(converter: Any, index: int) -> str:
    cls = converter if isinstance(converter, type) else type(converter)
    return f"model_converters[{index}] ({cls.__name__}, kind {converter_kind(converter)!r})"


def validate_converter_order(converters: Sequence[Any]) -> None:
    """Checks that ``converters`` may run in this order (see the module docstring for the rule).

    Works on instances or classes, so a config can be checked without building anything.

    Args:
        converters (Sequence[Any]): the converters in the order they would run.

    Raises:
        TypeError: when an entry has no ``convert`` method.
        ValueError: listing every pair in a wrong order or that cannot be combined, naming both converters and
            the fix.
    """
    problems = []
    for i, converter in enumerate(converters):
        if not callable(getattr(converter, "convert", None)):
            raise TypeError(
                f"model_converters[{i}] is a {type(converter).__name__}, which has no convert(model) method; a model "
                "converter is a class with convert(model) -> model and post_optimizer_hook(model)."
            )
    for j, later in enumerate(converters):
        for i, earlier in enumerate(converters[:j]):
            wrong_order = converter_kind(earlier) in tuple(getattr(later, "must_precede", ()))
            wrong_order |= converter_kind(later) in tuple(getattr(earlier, "must_follow", ()))
            if wrong_order:
                problems.append(
                    f"{_label(later, j)} must run before {_label(earlier, i)}: move it up in `model_converters:`."
                )
            conflicts = tuple(getattr(earlier, "conflicts_with", ())) + tuple(getattr(later, "conflicts_with", ()))
            if converter_kind(earlier) in conflicts or converter_kind(later) in conflicts:
                problems.append(
                    f"{_label(earlier, i)} and {_label(later, j)} cannot be combined (both replace the same layers): "
                    "keep one of them in `model_converters:`."
                )
    if problems:
        raise ValueError("invalid model_converters order:\n  " + "\n  ".join(problems))


def apply_model_converters(model: nn.Module, converters: Sequence[ModelConverter] | None) -> nn.Module:
    """Validates the order of ``converters`` and applies them to ``model`` one after the other.

    Args:
        model (nn.Module): the built model, weights loaded, not yet sharded.
        converters (Sequence[ModelConverter] | None): the instantiated ``model_converters:`` list; ``None`` or
            empty leaves the model unchanged.

    Returns:
        nn.Module: the converted model (use it instead of ``model``).

    Raises:
        TypeError: when an entry is not a converter or ``convert`` returns something that is not an ``nn.Module``.
        ValueError: when the order is invalid (:func:`validate_converter_order`).
    """
    converters = list(converters or [])
    validate_converter_order(converters)
    for i, converter in enumerate(converters):
        converted = converter.convert(model)
        if not isinstance(converted, nn.Module):
            raise TypeError(
                f"{_label(converter, i)}.convert(model) returned a {type(converted).__name__}; it must return the "
                "converted nn.Module (return the model itself when converting in place)."
            )
        model = converted
        log.info("Applied model converter %s", _label(converter, i))
    return model


def register_post_optimizer_hooks(
    optimizer: torch.optim.Optimizer, model: nn.Module, converters: Sequence[ModelConverter] | None
) -> list[Any]:
    """Registers each converter's ``post_optimizer_hook(model)`` to run after every ``optimizer.step()``.

    Args:
        optimizer (torch.optim.Optimizer): the optimizer (anything with ``register_step_post_hook``).
        model (nn.Module): the model the hooks receive (the converted, possibly sharded one).
        converters (Sequence[ModelConverter] | None): the converters; ones without the method are skipped.

    Returns:
        list[Any]: the hook handles (``handle.remove()`` unregisters one).

    Raises:
        TypeError: when a converter has a hook but ``optimizer`` cannot register step post-hooks.
    """
    handles = []
    for converter in converters or []:
        hook = getattr(converter, "post_optimizer_hook", None)
        if hook is None:
            continue
        register = getattr(optimizer, "register_step_post_hook", None)
        if register is None:
            raise TypeError(
                f"{type(converter).__name__} needs a hook after each optimizer step, but the optimizer "
                f"({type(optimizer).__name__}) has no register_step_post_hook; use a torch.optim optimizer."
            )
        handles.append(register(_post_step_hook(hook, model)))
    return handles


def _post_step_hook(hook: Callable[[nn.Module], None], model: nn.Module) -> Callable[..., None]:
    def run(optimizer: Any, args: Any, kwargs: Any) -> None:  # the signature torch.optim calls it with
        hook(model)

    return run


class LoRAConverter:
    """LoRA (or DoRA, or QLoRA) on any model, chosen by module names: the way to fine-tune a model whose builder has
    no ``lora_*`` variant (a base builder such as ``llama3_2_1b``, or a model family from outside tune) with the LoRA
    recipes, which then train only these adapters and save them in the PEFT format.

    ``convert`` calls :func:`~tune.modules.peft.apply_lora` on the model as built, its weights loaded (on the meta
    device in the distributed recipe, which initialises the adapters before sharding). In a config::

        model: {_component_: tune.models.llama3_2.llama3_2_1b}
        model_converters:
          - _component_: tune.training.LoRAConverter
            target_modules: [q_proj, v_proj, "layers.*.mlp.w1"]
            rank: 8
            alpha: 16

    Args:
        target_modules (str | Sequence[str]): patterns over ``model.named_modules()`` names, as in
            :func:`~tune.modules.peft.apply_lora` (a name or dotted suffix such as ``q_proj``, a glob, or a regular
            expression). Only ``nn.Linear`` layers are adapted.
        rank (int): LoRA rank.
        alpha (float): LoRA alpha; the update is scaled by ``alpha / rank``.
        dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): store the adapted layers' base weights in NF4 (QLoRA). Default False.

    Raises:
        ValueError: for a rank that is not a positive integer or an empty ``target_modules``; ``convert`` raises when
            no ``nn.Linear`` matches, listing the model's linear layers.
    """

    kind = "peft"
    must_precede: tuple[str, ...] = ()
    must_follow: tuple[str, ...] = ()
    conflicts_with: tuple[str, ...] = ()

    def __init__(
        self,
        target_modules: str | Sequence[str],
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        use_dora: bool = False,
        quantize_base: bool = False,
    ) -> None:
        targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"target_modules must be module names or patterns such as [q_proj, v_proj], got {target_modules!r}."
            )
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive integer such as 8, got {rank!r}.")
        self.target_modules = targets
        self.rank = rank
        self.alpha = float(alpha)
        self.dropout = float(dropout)
        self.use_dora = use_dora
        self.quantize_base = quantize_base

    def convert(self, model: nn.Module) -> nn.Module:
        """Puts adapters on the matching ``nn.Linear`` layers of ``model`` (in place) and freezes everything else.

        Args:
            model (nn.Module): the built model, not yet sharded.

        Returns:
            nn.Module: ``model``.

        Raises:
            ValueError: when no ``nn.Linear`` layer matches ``target_modules`` (the message lists them).
        """
        apply_lora(
            model,
            self.target_modules,
            rank=self.rank,
            alpha=self.alpha,
            dropout=self.dropout,
            use_dora=self.use_dora,
            quantize_base=self.quantize_base,
        )
        adapted = sum(isinstance(m, (LoRALinear, DoRALinear)) for m in model.modules())
        log.info("LoRA: %d layers adapted (rank %d, alpha %g)", adapted, self.rank, self.alpha)
        return model

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Nothing to do after a step."""


class FakeQuantizedLoRALinear(LoRALinear):
    """A :class:`LoRALinear` that fake-quantises its input and its merged weight ``W + (alpha / rank) B A``.

    Training then sees the rounding of the weight that :meth:`Int8DynActInt4WeightQATConverter.quantize` will
    produce from the merged checkpoint, so the fake-quantised model and the real quantised one agree. Adapter
    gradients pass the rounding straight through (torchao's straight-through estimator). State-dict keys are
    those of :class:`LoRALinear`; the fake quantisers hold no state.

    Made by :meth:`Int8DynActInt4WeightQATConverter.convert` from an existing ``LoRALinear`` (the class of the
    module is switched and the quantisers attached, so weights, adapters and hooks stay where they are).
    """

    activation_fake_quantizer: nn.Module
    weight_fake_quantizer: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantised ``x @ (W + scaling * B A)^T + b``; the base weight only when ``disabled``.

        Args:
            x (torch.Tensor): ``[..., in_dim]``.

        Returns:
            torch.Tensor: ``[..., out_dim]``.
        """
        weight = self.weight if self.disabled else self.weight + self.lora_delta().to(self.weight.dtype)
        return F.linear(self.activation_fake_quantizer(x), self.weight_fake_quantizer(weight), self.bias)


class Int8DynActInt4WeightQATConverter:
    """Quantisation-aware training for int8 dynamic per-token activations and int4 grouped weights (torchao).

    ``convert`` (before training) puts fake quantisation on every linear layer: ``nn.Linear`` becomes torchao's
    ``FakeQuantizedLinear`` and :class:`~tune.modules.peft.LoRALinear` becomes :class:`FakeQuantizedLoRALinear`
    (the merged weight is fake-quantised). Parameter names are unchanged, so checkpoints are saved and loaded
    as usual. ``quantize`` (after training, in ``recipes/quantize.py``) turns the linear layers into real
    int8-activation/int4-weight ones with torchao's ``Int8DynamicActivationIntxWeightConfig``: the same
    numerics as the fake quantisation. Embeddings are left alone, and so are linear layers whose input size is
    not a multiple of ``groupsize`` (with a warning naming them).

    Args:
        groupsize (int): weights are quantised in groups of this many input features, each with one scale.
            Default 32.

    Raises:
        ValueError: when ``groupsize`` is not a positive integer.
        ImportError: when torchao is not installed (checked on first use).
    """

    kind = "qat"
    must_precede: tuple[str, ...] = ()
    must_follow = ("peft",)
    conflicts_with = ("float8",)

    def __init__(self, groupsize: int = 32) -> None:
        if isinstance(groupsize, bool) or not isinstance(groupsize, int) or groupsize <= 0:
            raise ValueError(f"groupsize must be a positive integer such as 32 or 256, got {groupsize!r}.")
        self.groupsize = groupsize

    def _base_config(self) -> Any:
        quantization = import_optional("torchao.quantization", "Int8DynActInt4WeightQATConverter")
        granularity = import_optional("torchao.quantization.granularity", "Int8DynActInt4WeightQATConverter")
        return quantization.Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=granularity.PerGroup(self.groupsize)
        )

    def _quantizable(self, model: nn.Module) -> tuple[set[str], list[str]]:
        """Names of the linear layers (plain or LoRA) to quantise, and of those skipped for their size."""
        adapters = {id(m.lora_a) for m in model.modules() if isinstance(m, LoRALinear)}
        adapters |= {id(m.lora_b) for m in model.modules() if isinstance(m, LoRALinear)}
        chosen, skipped = set(), []
        for name, module in model.named_modules():
            if id(module) in adapters or not isinstance(module, (nn.Linear, LoRALinear)):
                continue
            in_features = module.in_features if isinstance(module, nn.Linear) else module.in_dim
            if in_features % self.groupsize != 0:
                skipped.append(name)
            else:
                chosen.add(name)
        if skipped:
            warnings.warn(
                f"{type(self).__name__}: {len(skipped)} linear layer(s) stay unquantised because their input size "
                f"is not a multiple of groupsize={self.groupsize}: {', '.join(skipped[:8])}"
                f"{' ...' if len(skipped) > 8 else ''}",
                stacklevel=3,
            )
        return chosen, skipped

    def convert(self, model: nn.Module) -> nn.Module:
        """Puts fake quantisation on the linear layers of ``model`` (in place).

        Args:
            model (nn.Module): the built model, not yet sharded.

        Returns:
            nn.Module: ``model``.

        Raises:
            ValueError: for DoRA layers, an NF4 (QLoRA) base weight or LoRA dropout, which fake quantisation of
                the merged weight cannot represent.
        """
        quantization = import_optional("torchao.quantization", "Int8DynActInt4WeightQATConverter")
        qat = import_optional("torchao.quantization.qat", "Int8DynActInt4WeightQATConverter")
        dora = [name for name, m in model.named_modules() if isinstance(m, DoRALinear)]
        if dora:
            raise ValueError(
                f"QAT cannot fake-quantise the DoRA layers ({', '.join(dora[:4])}{' ...' if len(dora) > 4 else ''}): "
                "their weight is renormalised per column. Use LoRA (use_dora: False) with QAT, or drop the QAT "
                "converter."
            )
        chosen, _ = self._quantizable(model)
        lora = {name: m for name, m in model.named_modules() if name in chosen and isinstance(m, LoRALinear)}
        for name, module in lora.items():
            _check_lora_for_qat(name, module)
        prepare = qat.QATConfig(self._base_config(), step="prepare")
        quantization.quantize_(model, prepare, filter_fn=lambda m, fqn: fqn in chosen and type(m) is nn.Linear)
        if lora:
            # torchao infers the fake quantisers from the base config for nn.Linear only: take the ones it built
            # for a probe layer, so LoRA layers fake-quantise exactly as plain ones.
            holder = nn.Sequential(nn.Linear(self.groupsize, 1, bias=False, device="meta"))
            quantization.quantize_(holder, qat.QATConfig(self._base_config(), step="prepare"))
            probe = holder[0]
            for module in lora.values():
                module.activation_fake_quantizer = copy.deepcopy(probe.activation_fake_quantizer)
                module.weight_fake_quantizer = copy.deepcopy(probe.weight_fake_quantizer)
                module.__class__ = FakeQuantizedLoRALinear
        log.info(
            "QAT: fake-quantised %d linear layers (int8 dynamic activations, int4 weights, group %d)",
            len(chosen),
            self.groupsize,
        )
        return model

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Nothing to do: the fake quantisation is dynamic (scales are computed in each forward)."""

    def quantize(self, model: nn.Module) -> nn.Module:
        """Turns a (fake-quantised or plain) model into the real int8-activation/int4-weight model, in place.

        Fake-quantised LoRA layers are merged into plain ``nn.Linear`` layers first. A plain ``LoRALinear`` is
        refused: load the merged checkpoint into the base (non-LoRA) model instead.

        Args:
            model (nn.Module): the trained model.

        Returns:
            nn.Module: ``model`` with quantised linear weights (torchao tensor subclasses).

        Raises:
            ValueError: when the model still holds unmerged, not fake-quantised LoRA layers.
        """
        quantization = import_optional("torchao.quantization", "Int8DynActInt4WeightQATConverter")
        qat = import_optional("torchao.quantization.qat", "Int8DynActInt4WeightQATConverter")
        _replace_modules(model, FakeQuantizedLoRALinear, _merged_linear)
        _replace_modules(model, qat.FakeQuantizedLinear, lambda m: m.to_linear())
        lora = [name for name, m in model.named_modules() if isinstance(m, LoRALinear)]
        if lora:
            raise ValueError(
                f"cannot quantise LoRA layers ({', '.join(lora[:4])}{' ...' if len(lora) > 4 else ''}): load the "
                "merged checkpoint the LoRA recipe saved (model weights, not the adapter) into the base model "
                "builder (e.g. llama3_2_1b instead of lora_llama3_2_1b)."
            )
        chosen, _ = self._quantizable(model)
        quantization.quantize_(model, self._base_config(), filter_fn=lambda m, fqn: fqn in chosen)
        log.info(
            "Quantised %d linear layers to int8 dynamic activations / int4 weights (group %d)",
            len(chosen),
            self.groupsize,
        )
        return model


# The name torchtune users know for the generic QAT converter.
QATConverter = Int8DynActInt4WeightQATConverter


def _check_lora_for_qat(name: str, module: LoRALinear) -> None:
    if is_nf4_tensor(module.weight):
        raise ValueError(
            f"QAT cannot fake-quantise {name!r}: its base weight is already NF4 (QLoRA). Use the lora_* builder "
            "(quantize_base: False) with QAT, or drop the QAT converter."
        )
    if not isinstance(module.dropout, nn.Identity):
        raise ValueError(
            f"QAT fake-quantises the merged LoRA weight of {name!r}, which cannot apply LoRA dropout "
            f"(p={module.dropout.p}); set lora_dropout: 0.0 in the model config."
        )


def _replace_modules(model: nn.Module, cls: type, make: Callable[[nn.Module], nn.Module]) -> None:
    """Replaces every submodule of type ``cls`` by ``make(submodule)``."""
    for name, module in list(model.named_modules()):
        if isinstance(module, cls) and name:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, make(module))


def _merged_linear(module: FakeQuantizedLoRALinear) -> nn.Linear:
    """An ``nn.Linear`` holding the merged weight of a fake-quantised LoRA layer."""
    linear = nn.Linear(module.in_dim, module.out_dim, bias=module.bias is not None, device="meta")
    merged = {"weight": module.merged_weight().detach()}
    if module.bias is not None:
        merged["bias"] = module.bias.detach()
    linear.load_state_dict(merged, assign=True)
    return linear


class Float8TrainingConverter:
    """Float8 matmuls for training through torchao (``torchao.float8.convert_to_float8_training``).

    Needs an NVIDIA GPU with compute capability 8.9 or newer (Ada, Hopper, Blackwell); anywhere else it is
    refused when constructed. Converts the ``nn.Linear`` layers whose sizes are multiples of 16, except those
    named in ``skip`` and LoRA adapters. With FSDP2 and ``enable_fsdp_float8_all_gather``, the post-optimizer
    hook precomputes the float8 scales of the sharded weights for the next all-gather.

    Args:
        recipe_name (str | None): a torchao float8 recipe (``"tensorwise"``, ``"rowwise"``, ...); ``None`` uses
            torchao's default (tensorwise scaling). Default None.
        enable_fsdp_float8_all_gather (bool): all-gather weights in float8 under FSDP2 (tensorwise only).
            Default False.
        skip (Sequence[str]): module-name suffixes left in high precision. Default ``("output",)``: the output
            projection is the most sensitive to float8 rounding.

    Raises:
        ValueError: when no CUDA GPU with compute capability >= 8.9 is available, saying what to use instead.
        ImportError: when torchao is not installed.
    """

    kind = "float8"
    must_precede: tuple[str, ...] = ()
    must_follow = ("peft",)
    conflicts_with = ("qat",)

    def __init__(
        self,
        recipe_name: str | None = None,
        enable_fsdp_float8_all_gather: bool = False,
        skip: Sequence[str] = ("output",),
    ) -> None:
        check_float8_supported()
        self.recipe_name = recipe_name
        self.enable_fsdp_float8_all_gather = enable_fsdp_float8_all_gather
        self.skip = tuple(skip)

    def _config(self) -> Any:
        float8 = import_optional("torchao.float8", "Float8TrainingConverter")
        if self.recipe_name is not None:
            if self.enable_fsdp_float8_all_gather:
                raise ValueError(
                    "enable_fsdp_float8_all_gather works with the default (tensorwise) recipe only; "
                    f"got recipe_name={self.recipe_name!r}. Drop one of the two."
                )
            return float8.Float8LinearConfig.from_recipe_name(self.recipe_name)
        return float8.Float8LinearConfig(enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather)

    def _keep(self, module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn.endswith(("lora_a", "lora_b")):
            return False
        if any(fqn == s or fqn.endswith("." + s) for s in self.skip):
            return False
        return module.in_features % _FLOAT8_DIM_MULTIPLE == 0 and module.out_features % _FLOAT8_DIM_MULTIPLE == 0

    def convert(self, model: nn.Module) -> nn.Module:
        """Swaps the eligible ``nn.Linear`` layers of ``model`` for torchao's ``Float8Linear`` (in place).

        Args:
            model (nn.Module): the built model, on the GPU, not yet sharded.

        Returns:
            nn.Module: the converted model.

        Raises:
            ValueError: when the model's parameters are not on a CUDA device.
        """
        devices = {p.device.type for p in model.parameters()}
        if devices - {"cuda", "meta"}:
            raise ValueError(
                "Float8TrainingConverter needs the model on a CUDA device, but its parameters are on "
                f"{sorted(devices)}; set device: cuda, or remove the converter from model_converters."
            )
        float8 = import_optional("torchao.float8", "Float8TrainingConverter")
        return float8.convert_to_float8_training(model, module_filter_fn=self._keep, config=self._config())

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Precomputes float8 scales of FSDP2-sharded weights after a step (only with float8 all-gather)."""
        if self.enable_fsdp_float8_all_gather:
            float8 = import_optional("torchao.float8", "Float8TrainingConverter")
            float8.precompute_float8_dynamic_scale_for_fsdp(model)


def check_float8_supported() -> None:
    """Raises a ValueError saying why float8 training cannot run here, or returns when it can.

    Raises:
        ValueError: without a CUDA GPU, or with one older than compute capability 8.9.
    """
    instead = (
        "Remove Float8TrainingConverter from model_converters and train in bf16 (dtype: bf16); on a GPU of "
        "compute capability 8.9+ (e.g. L4, L40, H100) float8 training works."
    )
    if not torch.cuda.is_available():
        raise ValueError(
            f"Float8TrainingConverter needs an NVIDIA GPU with compute capability >= 8.9 for float8 "
            f"matmuls, but no CUDA device is available (CPU-only PyTorch or no GPU). {instead}"
        )
    capability = torch.cuda.get_device_capability()
    if capability < _FLOAT8_MIN_CAPABILITY:
        raise ValueError(
            f"Float8TrainingConverter needs compute capability >= 8.9 for float8 matmuls, but "
            f"{torch.cuda.get_device_name()} has {capability[0]}.{capability[1]}. {instead}"
        )
