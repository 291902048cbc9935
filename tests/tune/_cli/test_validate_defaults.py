"""`tune validate CONFIG --show-defaults` (tune/_cli/_validate.py): after a clean check, the optional keys the recipe
reads (the tables of its RECIPE_INFO["optional_keys"], tune.config.OPTIONAL_KEYS) with the value each will take."""

import textwrap

import pytest

from tune.config import recipe_defaults

RECIPE = textwrap.dedent("""\
    from tune import config

    RECIPE_INFO = {"supports_distributed": False, "configs": [], "optional_keys": ["finetune", "lora"]}


    @config.parse
    def recipe_main(cfg):
        print(cfg.epochs, cfg.clip_grad_norm, cfg.save_adapter_weights_only)
""")

CONFIG = textwrap.dedent("""\
    epochs: 1
    gradient_accumulation_steps: 1  # checked for every recipe with the "finetune" table
    clip_grad_norm: 1.0
    lr_scheduler: null  # explicit: a constant learning rate
    profiler:
      _component_: tune.training.setup_torch_profiler
      enabled: false
""")


@pytest.fixture
def recipe_and_config(tmp_path):
    recipe, config = tmp_path / "tables_recipe.py", tmp_path / "my.yaml"
    recipe.write_text(RECIPE)
    config.write_text(CONFIG)
    return recipe, config


def _key_lines(out: str) -> list[str]:
    """The report's top-level lines (one per optional key), without nested lines of a node."""
    report = out.split("optional keys of ", 1)[1].splitlines()[1:]
    return [line for line in report if line.startswith("  ") and not line.startswith("   ")]


def test_each_optional_key_is_shown_with_its_value_and_origin(tune, recipe_and_config):
    recipe, config = recipe_and_config
    code, out, err = tune("validate", str(config), "--recipe", str(recipe), "--show-defaults", "log_every_n_steps=5")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == f"OK: {config} is valid for recipe tables_recipe"
    assert lines[1] == "optional keys of tables_recipe (tables: finetune, lora):"
    keys = _key_lines(out)
    assert [line.split(":")[0].strip() for line in keys] == list(recipe_defaults(["finetune", "lora"]))
    assert "  log_every_n_steps: 5  # config" in keys  # from the command line
    assert "  clip_grad_norm: 1.0  # config" in keys
    assert "  lr_scheduler: null  # config" in keys  # an explicit null is the config's choice
    assert "  compile: false  # default" in keys
    assert "  save_adapter_weights_only: false  # default" in keys  # the lora table
    profiler = lines.index("  profiler:")
    assert lines[profiler + 1].strip() == "_component_: tune.training.setup_torch_profiler"
    assert lines[profiler + 2].strip() == "enabled: false  # config"


def test_a_null_default_says_what_it_means(tune, recipe_and_config):
    recipe, config = recipe_and_config
    code, out, _ = tune("validate", str(config), "--recipe", str(recipe), "--show-defaults", "~clip_grad_norm")
    assert code == 0
    keys = _key_lines(out)
    collate = next(line for line in keys if line.startswith("  collate_fn:"))
    assert collate.startswith("  collate_fn: null  # default: tune.data.padding_free_collate on CPU")
    assert "  clip_grad_norm: null  # default: no clipping (the grad norm is still logged)" in keys


def test_without_the_flag_nothing_is_shown(tune, recipe_and_config):
    recipe, config = recipe_and_config
    code, out, _ = tune("validate", str(config), "--recipe", str(recipe))
    assert (code, out) == (0, f"OK: {config} is valid for recipe tables_recipe\n")


def test_a_config_with_problems_shows_no_defaults(tune, recipe_and_config):
    recipe, config = recipe_and_config
    code, out, _ = tune("validate", str(config), "--recipe", str(recipe), "--show-defaults", "log_every_n_steps=0")
    assert code == 1
    assert "log_every_n_steps = 0: must be an integer >= 1" in out
    assert "optional keys of" not in out


def test_without_a_recipe(tune, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("a: 1\n")
    code, out, _ = tune("validate", str(config), "--show-defaults")
    assert code == 0
    assert out.splitlines()[1:] == ["no recipe: no optional keys to show (name one with --recipe NAME)"]


def test_a_recipe_that_declares_no_optional_keys(tune, shipped):
    code, out, _ = tune("validate", "toy/tiny_echo", "--show-defaults")
    assert code == 0
    assert out.splitlines() == [
        "OK: toy/tiny_echo is valid for recipe echo_single_device",
        "recipe echo_single_device declares no optional keys (RECIPE_INFO['optional_keys'])",
    ]


def test_a_shipped_config_with_its_built_in_recipe(tune):
    # the example of `tune validate --help`
    code, out, err = tune("validate", "llama3_2/1B_lora_single_device", "--show-defaults")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[:2] == [
        "OK: llama3_2/1B_lora_single_device is valid for recipe lora_finetune_single_device",
        "optional keys of lora_finetune_single_device (tables: finetune, lora, moe):",
    ]
    keys = _key_lines(out)
    assert [line.split(":")[0].strip() for line in keys] == list(recipe_defaults(["finetune", "lora", "moe"]))
    assert "  dataset_val: null  # default" in keys  # the config has no validation set
    assert not any(line.strip().startswith("tensor_parallel_dim") for line in keys)  # not a distributed recipe


def test_the_distributed_table(tune, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("epochs: 1\ntensor_parallel_dim: 2\n")
    recipe = tmp_path / "dist_tables.py"
    recipe.write_text(
        'from tune import config\n\nRECIPE_INFO = {"supports_distributed": True, "optional_keys": ["distributed"]}\n'
        "\n\n@config.parse\ndef recipe_main(cfg):\n    print(cfg.epochs)\n"
    )
    code, out, err = tune("validate", str(config), "--recipe", str(recipe), "--show-defaults")
    assert code == 0, out + err
    keys = _key_lines(out)
    assert [line.split(":")[0].strip() for line in keys] == list(recipe_defaults(["distributed"]))
    assert "  tensor_parallel_dim: 2  # config" in keys
    assert "  fsdp_reshard_after_forward: true  # default" in keys
    assert "  tensor_parallel_plan: null  # default: the model family's plan (tune.registry)" in keys
