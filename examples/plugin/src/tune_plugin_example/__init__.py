"""An example tune plugin: a recipe (with its config), a dataset builder and a model converter.

tune finds them through the ``tune.plugins`` entry points declared in this distribution's ``pyproject.toml``;
nothing here is imported until tune asks for one of them.
"""

from pathlib import Path

from tune.plugins import RecipeSpec

_HERE = Path(__file__).parent

# `tune run tune_example_train --config tune_example/tiny`; the configs folder is searched recursively and each
# config is named by its path below it, without `.yaml`.
RECIPE = RecipeSpec(path=_HERE / "train_tiny.py", configs=(_HERE / "configs",), supports_distributed=False)

__all__ = ["RECIPE"]
