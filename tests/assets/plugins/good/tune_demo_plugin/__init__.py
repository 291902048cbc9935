"""Fixture tune plugin: what a third-party package would ship."""

from pathlib import Path

from tune.plugins import RecipeSpec
from tune.registry import ModelFamily

_HERE = Path(__file__).resolve().parent

RECIPE = RecipeSpec(path=_HERE / "recipe.py", configs=(_HERE / "configs",), supports_distributed=False)


def demo_tiny() -> dict:
    """A stand-in model builder (the family is only listed, never built, in the tests)."""
    return {"layers": 1}


FAMILY = ModelFamily(name="demo_family", builders={"demo_tiny": demo_tiny}, hf_model_types=("demo",))
