"""What the built-in families share to declare themselves (``FAMILY = ModelFamily(...)`` in each ``__init__``)."""

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any


def family_builders(*modules: ModuleType) -> dict[str, Callable[..., Any]]:
    """The public builders of a family, by name, read from its builder modules.

    A builder is a public function bound in one of ``modules`` and defined in the family's own package: the
    component builders (``llama2``, ``lora_llama2``) and the named sizes with their LoRA and QLoRA variants.
    Whatever a module imports from elsewhere is left out: helpers (``tune.models._common.build_decoder``) and
    another family's builders (llama3_3's sizes call llama3_1's component builder). A ``functools.partial`` of
    one of the family's functions (``qlora_*`` = ``lora_*`` with ``quantize_base=True``) is the family's own.

    Args:
        *modules (ModuleType): the family's ``_component_builders`` and ``_model_builders`` modules.

    Returns:
        dict[str, Callable[..., Any]]: builders by name, in the order the modules define them.
    """
    builders: dict[str, Callable[..., Any]] = {}
    for module in modules:
        package = module.__name__.rpartition(".")[0]  # tune.models.llama3_3
        for name, value in vars(module).items():
            if name.startswith("_") or not callable(value) or inspect.isclass(value):
                continue
            if _made_by(value, package):
                builders[name] = value
    return builders


def _made_by(value: Callable[..., Any], package: str) -> bool:
    while isinstance(value, functools.partial):
        value = value.func
    origin = getattr(value, "__module__", None) or ""
    return origin == package or origin.startswith(package + ".")
