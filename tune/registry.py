"""The model-family registry: one place that says what a family provides.

Each built-in family declares itself as a module-level value ``FAMILY = ModelFamily(...)`` in its package
(``tune/models/<family>/__init__.py``) and never calls into this module on import; plugins ship a
:class:`ModelFamily` through an entry point (``tune.plugins``); user code may call :func:`register_model_family`
at run time. Checkpointers look converters up here by ``model_type``, ``tune.models.from_hf`` picks the family
of a Hugging Face ``config.json`` here, ``tune ls --models`` lists it, and the distributed recipes read the FSDP
shard rule and tensor-parallel plan from it. There is no if/elif on model type anywhere else.

This module is a leaf like ``tune.utils``: at import time it imports nothing from tune but ``tune.plugins``, so
every layer may read it. Built-in families are found, not listed: every public subpackage of ``tune.models`` is
one, named after its package, and is imported by name (``importlib``) the first time a lookup asks for it. That
lookup is the one import in tune that runs back up a layer (families import this module for ``ModelFamily``);
``tests/test_layering.py`` allows it and no other import cycle, and families never call the lookups. A
lookup by a family's own name imports that family only; an alias (``phi3_mini``), a Hugging Face ``model_type``
or :func:`list_model_families` imports them all. A family that fails to import is reported once as a warning
naming it and the error, and the others keep working.
"""

import importlib
import importlib.util
import pkgutil
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tune import plugins

# tune -> HF and HF -> tune state-dict conversion. Each takes the state dict and the HF `config.json` as a
# dict (dimensions such as num_attention_heads are needed to permute q/k projections) and returns a new dict.
StateDictConverter = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class AdapterConverter:
    """LoRA adapters <-> the Hugging Face PEFT format, for a family whose HF modules do not map one to one onto
    tune's (Phi-3 fuses ``q/k/v_proj`` into ``qkv_proj``). Modules it leaves alone go through the family's
    state-dict converters as usual.

    Args:
        to_peft (Callable): ``(adapter, hf_config, lora_alpha) -> (rest, peft_state, ranks, alphas)``: takes tune
            adapter weights, returns the ones it did not handle (tune keys), the PEFT weights it made (HF module
            names without PEFT's ``base_model.model.`` prefix), and each made module's rank and alpha.
        from_peft (Callable): ``(peft_state, hf_config, lora_alpha, scalings) -> (rest, adapter)``: takes PEFT
            weights (no prefix), the alpha of tune's LoRA layers and each module's PEFT scaling (``alpha / r``),
            returns the weights it did not handle and the tune adapter weights it made; raises ``ValueError`` when
            a module cannot be split exactly.
        exact_targets (bool): PEFT's ``target_modules`` lists each adapted module's full name instead of the last
            parts of the names, for a model with modules of those names that carry no adapter (a vision tower's
            ``gate_proj``) or whose adapted modules have bare indices as names (``merger.mlp.0``). Default False.
    """

    to_peft: Callable[..., Any]
    from_peft: Callable[..., Any]
    exact_targets: bool = False


@dataclass(frozen=True)
class TorchtuneLayout:
    """How torchtune 0.6.1's model of a family names and orders its weights, where that differs from tune's.

    Module names are tune's in every case; torchtune names the norms' parameter ``scale`` (tune: ``weight``).

    Args:
        interleaved_rope (bool): torchtune's RoPE for the family rotates interleaved pairs (Meta's layout: Llama,
            Mistral, Gemma), so the q/k projection rows are permuted to tune's rotate_half order on load. False
            where torchtune's RoPE is rotate_half like tune's (Qwen, Phi-3).
        key_renames (tuple[tuple[str, str], ...]): ``(regex, replacement)`` pairs from torchtune's keys (after
            ``scale`` -> ``weight``) to tune's where the names differ; the first pair that matches renames a key.
    """

    interleaved_rope: bool = False
    key_renames: tuple[tuple[str, str], ...] = ()


@dataclass
class ModelFamily:
    """What a model family provides to the rest of tune.

    Args:
        name (str): family name, lower case (``"llama3_2"``). ``model_type`` values in configs match it
            case-insensitively, so torchtune's ``LLAMA3_2`` works.
        builders (Mapping[str, Callable]): named builders, e.g. ``{"llama3_2_1b": llama3_2_1b, ...}``, including
            ``lora_*`` and ``qlora_*`` variants.
        hf_to_tune (StateDictConverter | None): converts a Hugging Face state dict to tune's keys.
        tune_to_hf (StateDictConverter | None): the inverse.
        hf_model_types (tuple[str, ...]): ``config.json`` ``model_type`` values this family can load in
            ``tune.models.from_hf`` (e.g. ``("qwen3",)``). Several families may share one HF type (all Llama
            generations are ``"llama"``); ``from_hf`` uses the family that registered ``from_hf_config``.
        from_hf_config (Callable | None): ``(hf_config: dict, **lora_kwargs) -> nn.Module`` building the model
            with the dimensions of a ``config.json``.
        tokenizer (Callable | None): the tokenizer builder (``path, max_seq_len=..., ...``).
        aliases (tuple[str, ...]): other names accepted as ``model_type`` (``("qwen2",)`` for qwen2_5).
        fsdp_shard_modules (Callable | None): ``model -> list[nn.Module]`` of the submodules to wrap with
            ``fully_shard`` (default in tune.training: every transformer layer).
        tp_plan (Callable | None): ``model -> dict[str, ParallelStyle]`` tensor-parallel plan.
        adapter_converter (AdapterConverter | None): LoRA adapters <-> PEFT where HF fuses modules tune keeps
            apart; ``None``: adapters map module by module through ``tune_to_hf``/``hf_to_tune``.
        torchtune_layout (TorchtuneLayout | None): how torchtune 0.6.1's model of this family lays out its weights,
            for reading (and writing back) files of torchtune's ``FullModelTorchTuneCheckpointer``; None where
            torchtune has no such family (such files are then read with tune's own keys).
        passthrough_hf_keys (str | None): a regular expression (``re.match``) on the Hugging Face checkpoint keys
            of weights the family builds no module for but which belong to the checkpoint (Gemma 3's vision tower
            and projector): ``hf_to_tune`` drops them, and ``FullModelHFCheckpointer`` copies them unchanged from
            the input files (read at save time, in their own dtype and file) into every model it writes, so the
            output is the whole model again; a PEFT adapter written for such a checkpoint excludes the modules
            they belong to. None: the checkpoint holds the family's model only.
        sizes (Mapping[str, Any]): the released sizes (the family's ``MODEL_SIZES``: builder name -> ``ModelSize``
            with ``dims``), where checkpointers look up head counts that a checkpoint does not state.
        extra (dict): anything else a plugin wants to attach.
    """

    name: str
    builders: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    hf_to_tune: StateDictConverter | None = None
    tune_to_hf: StateDictConverter | None = None
    hf_model_types: tuple[str, ...] = ()
    from_hf_config: Callable[..., Any] | None = None
    tokenizer: Callable[..., Any] | None = None
    aliases: tuple[str, ...] = ()
    fsdp_shard_modules: Callable[..., Any] | None = None
    tp_plan: Callable[..., Any] | None = None
    adapter_converter: AdapterConverter | None = None
    torchtune_layout: "TorchtuneLayout | None" = None
    passthrough_hf_keys: str | None = None
    sizes: Mapping[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


_FAMILIES: dict[str, ModelFamily] = {}
_ALIASES: dict[str, str] = {}
_imported: set[str] = set()  # built-in families already imported (or tried)
_broken: dict[str, Exception] = {}  # built-in family -> why it failed to import
_builtins_loaded = False  # every built-in family has been tried
_plugins_loaded = False


def register_model_family(family: ModelFamily, *, overwrite: bool = False) -> ModelFamily:
    """Registers ``family`` under its name and aliases.

    Built-in families need no call: the registry finds them. Use this for a family defined in your own code;
    registered before the first lookup of a built-in family of the same name, it takes that name's place.

    Raises:
        ValueError: if the name is taken by another family and ``overwrite`` is False.
    """
    name = family.name.lower()
    if name in _FAMILIES and _FAMILIES[name] is not family and not overwrite:
        raise ValueError(f"A model family named {name!r} is already registered; pass overwrite=True to replace it.")
    _FAMILIES[name] = family
    for alias in family.aliases:
        _ALIASES[alias.lower()] = name
    return family


# Public subpackages of ``tune.models`` that are not families but components families build on (torchtune's
# ``tune.models.clip``: a vision encoder and its image transform); they declare no ``FAMILY``.
SHARED_COMPONENT_PACKAGES = frozenset({"clip"})


def _builtin_names() -> list[str]:
    """The built-in families: the public subpackages of ``tune.models`` but ``SHARED_COMPONENT_PACKAGES``, found on
    disk, none of them imported."""
    # listing imports nothing of tune.models: its __path__ once imported, else find_spec, which locates the
    # package without running its __init__
    package = sys.modules.get("tune.models")
    if package is not None:
        folders = package.__path__
    else:
        folders = importlib.util.find_spec("tune.models").submodule_search_locations
    return sorted(
        m.name
        for m in pkgutil.iter_modules(folders)
        if m.ispkg and not m.name.startswith("_") and m.name not in SHARED_COMPONENT_PACKAGES
    )


def _load_builtin(name: str) -> None:
    """Imports the built-in family ``name`` and registers its ``FAMILY``; a failure is warned about once."""
    if name in _imported:
        return
    _imported.add(name)
    try:
        # the one import of tune.models here, and the one allowed upward arrow in tune (tests/test_layering.py)
        module = importlib.import_module(f"tune.models.{name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, ModelFamily):
            raise TypeError(f"tune.models.{name} declares no `FAMILY = ModelFamily(...)`")
        if family.name.lower() != name:
            raise ValueError(f"tune.models.{name} declares a family named {family.name!r}; name it {name!r}")
    except Exception as err:  # one broken family must not break the others: report it and carry on
        _broken[name] = err
        warnings.warn(
            f"tune model family {name!r} (tune.models.{name}) failed to load and is ignored: "
            f"{type(err).__name__}: {err}",
            stacklevel=3,
        )
        return
    if name not in _FAMILIES:  # a family the user registered under this name first keeps it
        register_model_family(family)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for name in _builtin_names():
            _load_builtin(name)
        _builtins_loaded = True


def _load_plugins() -> None:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for family in plugins.load_all(ModelFamily).values():
            if family.name.lower() not in _FAMILIES:
                register_model_family(family)


def _find(name: str) -> ModelFamily | None:
    key = name.lower()
    key = _ALIASES.get(key, key)
    return _FAMILIES.get(key)


def get_model_family(name: str) -> ModelFamily:
    """The family registered as ``name`` (case-insensitive, aliases accepted; ``LLAMA3_2`` finds ``llama3_2``).

    A built-in family's own name imports that family only; any other name (an alias, a plugin's family) imports
    every built-in family, then the plugins, until one matches.

    Raises:
        ValueError: listing the registered families when there is none of that name, or naming the error when
            the built-in family of that name failed to import.
    """
    family = _find(name)
    key = name.lower()
    if family is None and not _builtins_loaded and key in _builtin_names():
        _load_builtin(key)
        family = _find(name)
    # a built-in family that failed to import is reported as such, without importing every other one
    if family is None and key not in _broken:
        _load_builtins()
        family = _find(name)
    if family is None and key not in _broken:
        _load_plugins()
        family = _find(name)
    if family is None:
        if key in _broken:
            err = _broken[key]
            raise ValueError(
                f"The model family {key!r} (tune.models.{key}) failed to load: {type(err).__name__}: {err}"
            ) from err
        known = ", ".join(sorted(_FAMILIES)) or "(none)"
        raise ValueError(f"Unknown model_type {name!r}. Registered model families: {known}.")
    return family


def list_model_families() -> dict[str, ModelFamily]:
    """Every registered family, built-in and from plugins, by name (families that failed to load are warned about)."""
    _load_builtins()
    _load_plugins()
    return dict(sorted(_FAMILIES.items()))


def family_for_hf_model_type(model_type: str) -> ModelFamily:
    """The family that builds models for a Hugging Face ``config.json`` ``model_type``.

    Raises:
        ValueError: listing the supported ``model_type`` values when none matches.
    """
    families = list_model_families().values()
    for family in families:
        if model_type in family.hf_model_types and family.from_hf_config is not None:
            return family
    supported = sorted({t for f in families if f.from_hf_config is not None for t in f.hf_model_types})
    raise ValueError(
        f"Unsupported Hugging Face model_type {model_type!r}. Supported: {', '.join(supported) or '(none)'}."
    )


def _reset_for_tests() -> None:
    """Forgets every registered family and what was tried (tests that break or add families at run time)."""
    global _builtins_loaded, _plugins_loaded
    _FAMILIES.clear()
    _ALIASES.clear()
    _imported.clear()
    _broken.clear()
    _builtins_loaded = _plugins_loaded = False
