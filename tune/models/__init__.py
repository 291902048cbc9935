"""Model families (one folder each) and loading Hugging Face checkpoints without naming a builder.

Every public subpackage is a family and declares itself (``FAMILY = ModelFamily(...)``); ``tune.registry`` finds
them there. The exceptions, ``tune.registry.SHARED_COMPONENT_PACKAGES`` (``clip``), hold components families build
on. Nothing is imported here up front: ``import tune.models.llama2`` loads that family only, and
``tune.models.qwen2_5`` or ``tune.models.from_hf`` are imported on first access.
"""

import importlib
import pkgutil

from tune.registry import SHARED_COMPONENT_PACKAGES

# tune.models._from_hf: the entry points importable from tune.models itself (they look families up in
# tune.registry, so they are imported on first access, never by a family)
_HF_FUNCTIONS = ("from_hf", "to_hf_state_dict")
# tune.models._classifier: any family's decoder as a sequence classifier (a reward model)
_CLASSIFIER_FUNCTIONS = ("classifier_model", "init_classifier_head")


def _families() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(__path__)
        if m.ispkg and not m.name.startswith("_") and m.name not in SHARED_COMPONENT_PACKAGES
    )


def __getattr__(name: str):
    # Lazy attributes (PEP 562): `tune.models.llama2.llama2_7b()` and `tune.models.from_hf(...)` without a
    # family being imported before it is asked for. `from tune.models import qwen2_5` imports the submodule
    # itself and never gets here.
    if name in _HF_FUNCTIONS:
        return getattr(importlib.import_module("tune.models._from_hf"), name)
    if name in _CLASSIFIER_FUNCTIONS:
        return getattr(importlib.import_module("tune.models._classifier"), name)
    if not name.startswith("_") and (name in _families() or name in SHARED_COMPONENT_PACKAGES):
        return importlib.import_module(f"tune.models.{name}")  # binds itself here as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [*_HF_FUNCTIONS, *_CLASSIFIER_FUNCTIONS, *_families()]
