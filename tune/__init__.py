"""tune: native-PyTorch fine-tuning of large language models.

Importing ``tune`` is cheap and has no side effects: subpackages (``tune.models``, ``tune.training``, ...) are
imported on first use, and no optional dependency is touched.
"""

import importlib

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


def __getattr__(name: str):
    # Lazy subpackages: `import tune; tune.models.llama3_2.llama3_2_1b()` works without paying for every import.
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tune.{name}")
    raise AttributeError(f"module 'tune' has no attribute {name!r}")
