"""tune: native-PyTorch fine-tuning of large language models.

Importing ``tune`` is cheap: subpackages (``tune.models``, ``tune.training``, ...) are imported on first use, and
no optional dependency is touched. Its one effect is a finder for the module paths of :data:`MODULE_ALIASES`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

__version__ = "0.1.0"

_SUBPACKAGES = (
    "config",
    "data",
    "datasets",
    "generation",
    "models",
    "modules",
    "plugins",
    "recipe_interfaces",
    "registry",
    "training",
    "utils",
)

__all__ = ["__version__", *_SUBPACKAGES]

# torchtune module paths (with tune's prefix) whose code lives elsewhere in tune, so that a migrated recipe's imports
# resolve: torchtune's CheckpointClient reads a recipe config, so it sits above tune.training, at tune.config's level.
MODULE_ALIASES = {"tune.training.checkpointing._checkpoint_client": "tune.config._checkpoint_client"}


class _AliasLoader(importlib.abc.Loader):
    # "loads" an alias by importing the module it names: both names then refer to one module object
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its own name


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MODULE_ALIASES:
            return None
        return importlib.util.spec_from_loader(name, _AliasLoader(MODULE_ALIASES[name]))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str):
    # Lazy subpackages: `import tune; tune.models.llama3_2.llama3_2_1b()` works without paying for every import.
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tune.{name}")
    raise AttributeError(f"module 'tune' has no attribute {name!r}")
