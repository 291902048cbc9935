"""`tune ls [FILTER] [--models]` (tune/_cli/_ls.py)."""

import pytest

from tune import registry
from tune.registry import ModelFamily

FULL = """\
RECIPE              DISTRIBUTED  CONFIG
dev/no_info         no           -
dist_echo           yes          toy/tiny_dist
echo_single_device  no           echo_default
                                 toy/tiny_echo
"""


def test_lists_every_recipe_with_its_configs_and_distributed_support(tune, shipped):
    code, out, err = tune("ls")
    assert (code, out, err) == (0, FULL, "")


def test_filter_on_a_recipe_name_keeps_all_its_configs(tune, shipped):
    code, out, _ = tune("ls", "ECHO_single")
    assert out.splitlines()[1:] == [
        "echo_single_device  no           echo_default",
        "                                 toy/tiny_echo",
    ]


def test_filter_on_config_names_keeps_only_matching_configs(tune, shipped):
    code, out, _ = tune("ls", "tiny")
    assert out.splitlines() == [
        "RECIPE              DISTRIBUTED  CONFIG",
        "dist_echo           yes          toy/tiny_dist",
        "echo_single_device  no           toy/tiny_echo",
    ]


def test_no_match_says_so(tune, shipped):
    code, out, err = tune("ls", "zzz")
    assert (code, out) == (0, "") and "no recipe or config matching 'zzz'" in err


def test_a_config_no_recipe_claims_is_shown(tune, shipped, tmp_path, monkeypatch):
    from tune.config import _discovery

    configs = tmp_path / "configs"
    (configs / "toy").mkdir(parents=True)
    (configs / "toy" / "tiny_echo.yaml").write_text("a: 1\n")
    (configs / "toy" / "stray.yaml").write_text("a: 1\n")
    monkeypatch.setattr(_discovery, "shipped_dirs", lambda: (shipped / "recipes", configs))
    code, out, _ = tune("ls", "toy/")
    assert out.splitlines()[-1] == "(no recipe)         -            toy/stray"


@pytest.fixture
def families(monkeypatch):
    fams = {
        "alpha": ModelFamily(name="alpha", builders={"alpha_1b": len, "lora_alpha_1b": len}, hf_model_types=("alph",)),
        "beta": ModelFamily(name="beta", builders={"beta_7b": len}),
    }
    # the registry as if every built-in family and plugin had been loaded
    monkeypatch.setattr(registry, "_FAMILIES", fams)
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    monkeypatch.setattr(registry, "_plugins_loaded", True)
    return fams


def test_models_lists_the_registered_families(tune, families):
    code, out, _ = tune("ls", "--models")
    assert out.splitlines() == [
        "FAMILY  HF MODEL TYPES  BUILDERS",
        "alpha   alph            alpha_1b, lora_alpha_1b",
        "beta    -               beta_7b",
    ]
    code, out, _ = tune("ls", "--models", "lora")
    assert out.splitlines()[1:] == ["alpha   alph            lora_alpha_1b"]
