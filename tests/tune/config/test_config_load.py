"""tune/config/_load.py: reading YAML files and applying command-line overrides."""

import pytest
from omegaconf import OmegaConf

from tune.config import ConfigError, apply_overrides, load_config, parse_override_value, read_yaml


def _cfg():
    return OmegaConf.create(
        {
            "batch_size": 4,
            "output_dir": "/tmp/out",
            "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-4, "fused": True},
            "dataset": [{"_component_": "a.b", "source": "x"}, {"_component_": "c.d", "source": "y"}],
            "profiler": {"enabled": False},
        }
    )


def test_read_yaml_missing_file_names_the_absolute_path(tmp_path):
    with pytest.raises(ConfigError, match=f"config file not found: {tmp_path}/nope.yaml"):
        read_yaml(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("a: 1\nb: [1,\nc: 2\n", 4, "flow sequence started at line 2"),  # parser gives up at EOF line 4
        ("a: 1\na: 2\n", 2, "duplicate key a"),
        ("a: b: c\n", 1, "mapping values are not allowed"),
    ],
)
def test_read_yaml_reports_syntax_errors_with_the_line(tmp_path, text, line, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    (problem,) = info.value.problems
    assert problem.line == line
    assert words in problem.message
    assert str(path) in str(info.value) and f"line {line}" in str(info.value)


def test_read_yaml_requires_a_mapping(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of keys to values at the top level, got a list"):
        read_yaml(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8),
        ("2e-5", 2e-5),  # a float, as OmegaConf reads it in a file (plain YAML 1.1 would say a string)
        ("true", True),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("{x: 1}", {"x": 1}),
        ("'quoted'", "quoted"),
        ("a=b", "a=b"),
        ("Q: what? A: yes", "Q: what? A: yes"),  # a colon inside: a string, not a mapping
        ("#fff", "#fff"),
        ("hello # world", "hello # world"),
        ("pkg.mod:fn", "pkg.mod:fn"),
        ("${output_dir}/logs", "${output_dir}/logs"),
        ("", ""),
    ],
)
def test_parse_override_value(text, expected):
    value = parse_override_value(text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text", ["[1, 2", "{x: 1", "'open"])
def test_parse_override_value_rejects_broken_yaml_containers(text):
    with pytest.raises(ConfigError, match="cannot read"):
        parse_override_value(text, "k")


def test_overrides_set_nested_keys_and_values_containing_equals():
    cfg = apply_overrides(_cfg(), ["batch_size=8", "optimizer.lr=1e-4", "prompt=x=y=z", "new.deep.key=[1, 2]"])
    assert cfg.batch_size == 8 and cfg.optimizer.lr == 1e-4
    assert cfg.prompt == "x=y=z"
    assert OmegaConf.to_container(cfg.new) == {"deep": {"key": [1, 2]}}


def test_overrides_delete_keys_and_list_items():
    cfg = apply_overrides(_cfg(), ["~profiler", "~optimizer.fused", "~dataset.0"])
    assert "profiler" not in cfg and "fused" not in cfg.optimizer
    assert [d.source for d in cfg.dataset] == ["y"]


def test_overrides_address_list_items_both_ways():
    cfg = apply_overrides(_cfg(), ["dataset.0.source=p", "dataset[1].source=q"])
    assert [d.source for d in cfg.dataset] == ["p", "q"]


def test_override_on_a_component_node_swaps_the_component_and_keeps_its_arguments():
    cfg = apply_overrides(_cfg(), ["optimizer=torch.optim.SGD"])
    assert OmegaConf.to_container(cfg.optimizer) == {"_component_": "torch.optim.SGD", "lr": 3e-4, "fused": True}


def test_override_can_replace_a_component_node_after_deleting_it():
    cfg = apply_overrides(_cfg(), ["~optimizer", "optimizer=sgd"])
    assert cfg.optimizer == "sgd"


def test_override_interpolation_resolves_on_access():
    cfg = apply_overrides(_cfg(), ["log_dir=${output_dir}/logs"])
    assert cfg.log_dir == "/tmp/out/logs"


def test_bad_overrides_are_all_reported_with_the_expected_form():
    with pytest.raises(ConfigError) as info:
        apply_overrides(_cfg(), ["batch_size", "~nope", "a..b=1", "optimizer.lr=[1"])
    message = str(info.value)
    assert "4 problems" in message
    assert "bad override 'batch_size': expected `key=value`" in message
    assert "cannot delete '~nope'" in message
    assert "'a..b' is not a key path" in message
    assert "optimizer.lr" in message and "cannot read '[1'" in message


def test_deleting_a_misspelt_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        apply_overrides(_cfg(), ["~bach_size"])


def test_adding_a_key_close_to_an_existing_one_warns():
    with pytest.warns(UserWarning, match="did you mean 'batch_size'"):
        cfg = apply_overrides(_cfg(), ["bach_size=2"])
    assert cfg.bach_size == 2 and cfg.batch_size == 4  # still added: a recipe may read new keys


def test_load_config_applies_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb:\n  c: 2\n")
    cfg = load_config(path, ["b.c=3", "~a"])
    assert OmegaConf.to_container(cfg) == {"b": {"c": 3}}
