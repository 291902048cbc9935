"""tune/config/_instantiate.py: building objects from `_component_` nodes."""

import datetime
import fractions
import sys
import types
from collections import OrderedDict

import pytest
from omegaconf import OmegaConf

from tune.config import ConfigError, get_component_from_path, instantiate


class Box:
    """A component taking one positional and keyword arguments, recording what it got."""

    def __init__(self, first, *, size: int = 1, child=None, options=None):
        self.first, self.size, self.child, self.options = first, size, child, options


def test_sibling_keys_become_keyword_arguments():
    node = OmegaConf.create({"_component_": "fractions.Fraction", "numerator": 3, "denominator": 4})
    assert instantiate(node) == fractions.Fraction(3, 4)


def test_call_time_positional_and_keyword_arguments_are_added_and_keywords_win():
    node = OmegaConf.create({"_component_": f"{__name__}.Box", "size": 2})
    box = instantiate(node, "params", size=5)
    assert (box.first, box.size) == ("params", 5)


def test_nested_components_lists_of_them_and_plain_mappings_are_built_as_python_objects():
    cfg = OmegaConf.create(
        {
            "days": 3,
            "box": {
                "_component_": f"{__name__}.Box",
                "first": {"_component_": "datetime.timedelta", "days": "${days}"},
                "child": [
                    {"_component_": "fractions.Fraction", "numerator": 1, "denominator": 2},
                    {"_component_": "collections.OrderedDict", "a": 1},
                ],
                "options": {"inner": {"_component_": "fractions.Fraction", "numerator": 5}, "flag": True},
            },
        }
    )
    box = instantiate(cfg.box)
    assert box.first == datetime.timedelta(days=3)  # interpolation resolved against the root
    assert box.child == [fractions.Fraction(1, 2), OrderedDict(a=1)]
    assert type(box.child) is list and type(box.options) is dict  # components never see config objects
    assert box.options == {"inner": fractions.Fraction(5), "flag": True}


def test_a_list_node_instantiates_every_item_with_the_same_arguments():
    cfg = OmegaConf.create({"ds": [{"_component_": f"{__name__}.Box"}, {"_component_": f"{__name__}.Box", "size": 3}]})
    boxes = instantiate(cfg.ds, "tok")
    assert [(b.first, b.size) for b in boxes] == [("tok", 1), ("tok", 3)]


def test_plain_dicts_and_none_are_accepted():
    assert instantiate({"_component_": "fractions.Fraction", "numerator": 2}) == 2
    assert instantiate(None) is None


def test_module_colon_attribute_paths_resolve():
    assert instantiate({"_component_": "fractions:Fraction", "numerator": 7}) == 7


def test_names_defined_in_the_running_main_module_resolve(monkeypatch):
    # `tune run my_recipe.py` runs the recipe as __main__: components it defines are named without a module
    main = types.ModuleType("__main__")
    main.MyThing = Box
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert instantiate({"_component_": "MyThing", "first": 1, "size": 9}).size == 9
    assert get_component_from_path("MyThing") is Box


def test_a_module_imported_by_main_is_not_taken_for_a_local_name(monkeypatch):
    main = types.ModuleType("__main__")
    main.fractions = types.ModuleType("fractions")  # an unrelated module object bound to that name
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert get_component_from_path("fractions.Fraction") is fractions.Fraction


def test_the_working_directory_is_importable(tmp_path, monkeypatch):
    (tmp_path / "my_dataset_mod.py").write_text("def build(n):\n    return list(range(n))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert instantiate({"_component_": "my_dataset_mod.build", "n": 3}) == [0, 1, 2]
    sys.modules.pop("my_dataset_mod", None)


def test_unimportable_component_names_the_key_and_suggests_close_names():
    cfg = OmegaConf.create({"model": {"inner": {"_component_": "fractions.Fractoin"}}})
    with pytest.raises(ConfigError) as info:
        instantiate(cfg.model.inner)
    message = str(info.value)
    assert message.startswith("model.inner._component_ = 'fractions.Fractoin'")
    assert "did you mean fractions.Fraction" in message


def test_missing_module_is_reported():
    with pytest.raises(ConfigError, match="cannot import it: No module named 'no_such_pkg_xyz'"):
        instantiate({"_component_": "no_such_pkg_xyz.thing"})


def test_a_bare_unknown_name_says_it_is_neither_a_path_nor_a_plugin():
    with pytest.raises(ConfigError, match="neither a dotted path"):
        instantiate({"_component_": "surely_not_a_plugin_name"})


def test_node_without_component_key_is_an_error_naming_the_key():
    cfg = OmegaConf.create({"optimizer": {"lr": 1}})
    with pytest.raises(
        ConfigError, match="optimizer = {'lr': 1}: cannot instantiate: the node has no '_component_' key"
    ):
        instantiate(cfg.optimizer)


def test_wrong_arguments_name_the_key_and_suggest_the_right_one():
    cfg = OmegaConf.create({"frac": {"_component_": "fractions.Fraction", "numeratr": 1}})
    with pytest.raises(ConfigError) as info:
        instantiate(cfg.frac)
    assert "frac: the arguments do not match fractions.Fraction" in str(info.value)
    assert "did you mean 'numerator' instead of 'numeratr'" in str(info.value)


def test_unresolvable_interpolation_names_the_key():
    cfg = OmegaConf.create({"frac": {"_component_": "fractions.Fraction", "numerator": "${nope}"}})
    with pytest.raises(ConfigError, match="frac.numerator: Interpolation key 'nope' not found"):
        instantiate(cfg.frac)


def test_errors_raised_by_the_component_itself_propagate_with_a_note():
    cfg = OmegaConf.create({"frac": {"_component_": "fractions.Fraction", "numerator": 1, "denominator": 0}})
    with pytest.raises(ZeroDivisionError) as info:
        instantiate(cfg.frac)
    if sys.version_info >= (3, 11):
        assert any("while instantiating config key 'frac'" in note for note in info.value.__notes__)


def test_a_value_error_of_the_component_becomes_a_config_error_naming_the_key():
    # components raise ValueError for values a user can fix: the message must say which config key it was
    cfg = OmegaConf.create({"when": {"_component_": "datetime.date", "year": 2024, "month": 13, "day": 1}})
    with pytest.raises(ConfigError) as info:
        instantiate(cfg.when)
    assert str(info.value) == "when: datetime.date rejected its arguments: month must be in 1..12"
    assert isinstance(info.value.__cause__, ValueError)


def test_non_callable_component_is_rejected():
    with pytest.raises(ConfigError, match="not callable"):
        instantiate({"_component_": "math.pi"})
