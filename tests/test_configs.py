"""Every shipped config: found by discovery (recursively), claimed by exactly one recipe, and valid for it.

The count of configs discovery finds is compared with an independent walk of the configs folder, so a config
that discovery missed fails here instead of going unchecked.
"""

import os
from pathlib import Path

import pytest

from tune.config import builtin_configs, builtin_recipes, recipes_for_config, shipped_dirs, validate_config

RECIPES_DIR, CONFIGS_DIR = shipped_dirs()
CONFIGS = builtin_configs()
RECIPES = builtin_recipes()


def _count_yaml_files(root: Path | None) -> int:
    if root is None:
        return 0
    return sum(name.endswith(".yaml") for _, _, names in os.walk(root) for name in names)


def test_discovery_finds_every_config_file():
    found, on_disk = len(CONFIGS), _count_yaml_files(CONFIGS_DIR)
    print(f"{found} shipped configs found by discovery, {on_disk} *.yaml files under {CONFIGS_DIR}")
    assert found == on_disk
    if CONFIGS_DIR is not None:  # a .yml file would be neither listed nor checked: configs end in .yaml
        assert not list(CONFIGS_DIR.rglob("*.yml"))


def test_every_recipe_declares_its_metadata():
    missing = [name for name, recipe in RECIPES.items() if not recipe.has_info]
    print(f"{len(RECIPES)} shipped recipes: {', '.join(sorted(RECIPES))}")
    assert not missing, f"recipes without RECIPE_INFO: {missing}"


def test_every_config_is_claimed_by_exactly_one_recipe():
    claims = {name: [r.name for r in recipes_for_config(name, RECIPES.values())] for name in CONFIGS}
    for recipe in sorted(RECIPES):
        print(f"{recipe}: {sum(recipe in owners for owners in claims.values())} configs")
    unclaimed = sorted(name for name, owners in claims.items() if not owners)
    shared = {name: owners for name, owners in claims.items() if len(owners) > 1}
    assert not unclaimed, f"configs no recipe claims: {unclaimed}"
    assert not shared, f"configs claimed by several recipes: {shared}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_shipped_config_validates_against_its_recipe(name):
    owners = recipes_for_config(name, RECIPES.values())
    assert len(owners) == 1, f"{name} is claimed by {[r.name for r in owners]}"
    problems = validate_config(CONFIGS[name], owners[0].path)
    assert not problems, f"{name} ({owners[0].name}):\n" + "\n".join(f"  - {p}" for p in problems)
