"""Configs: YAML files with overrides, ``_component_`` instantiation, validation, and recipe/config discovery.

This package and ``tune._cli`` are the only parts of tune (besides recipes) that handle OmegaConf objects;
components receive plain arguments built by :func:`instantiate`.
"""

from tune.config._discovery import (
    RecipeInfo,
    builtin_configs,
    builtin_recipes,
    configs_of,
    find_config,
    find_recipe,
    list_configs,
    list_recipes,
    read_recipe_info,
    recipes_for_config,
    shipped_config_name,
    shipped_dirs,
)
from tune.config._errors import ConfigError, ConfigProblem, RecipeError, TuneError
from tune.config._imports import import_modules
from tune.config._instantiate import get_component_from_path, instantiate
from tune.config._io import check_output_dir, log_config, resolved_yaml, save_config
from tune.config._load import apply_overrides, load_config, parse_override_value, read_yaml
from tune.config._parse import parse
from tune.config._recipe import (
    init_parallel,
    instantiate_checkpointer,
    recipe_state,
    shard_model,
    sharded_recipe_state,
)
from tune.config._recipe_scan import read_unsupported
from tune.config._training import (
    IGNORED_KEYS,
    OPTIONAL_KEYS,
    KeepDefault,
    apply_defaults,
    check_config_keys,
    check_training_config,
    component_name,
    errors_at,
    instantiate_collate,
    instantiate_dataset,
    instantiate_lr_scheduler,
    instantiate_tensor_parallel_plan,
    recipe_defaults,
)
from tune.config._validate import validate_config, value_problems

__all__ = [
    "IGNORED_KEYS",
    "ConfigError",
    "ConfigProblem",
    "OPTIONAL_KEYS",
    "KeepDefault",
    "RecipeError",
    "RecipeInfo",
    "TuneError",
    "apply_defaults",
    "check_config_keys",
    "check_output_dir",
    "apply_overrides",
    "builtin_configs",
    "builtin_recipes",
    "check_training_config",
    "component_name",
    "configs_of",
    "errors_at",
    "find_config",
    "find_recipe",
    "get_component_from_path",
    "import_modules",
    "init_parallel",
    "instantiate",
    "instantiate_checkpointer",
    "instantiate_collate",
    "instantiate_dataset",
    "instantiate_lr_scheduler",
    "instantiate_tensor_parallel_plan",
    "list_configs",
    "list_recipes",
    "load_config",
    "log_config",
    "parse",
    "parse_override_value",
    "read_recipe_info",
    "read_unsupported",
    "read_yaml",
    "recipe_state",
    "recipe_defaults",
    "recipes_for_config",
    "resolved_yaml",
    "save_config",
    "shard_model",
    "sharded_recipe_state",
    "shipped_config_name",
    "shipped_dirs",
    "validate_config",
    "value_problems",
]
