"""`tune cat CONFIG` (tune/_cli/_cat.py)."""


def test_prints_the_config_as_written(tune, shipped):
    code, out, _ = tune("cat", "toy/tiny_echo")
    assert code == 0 and out == (shipped / "configs" / "toy" / "tiny_echo.yaml").read_text()


def test_a_recipe_name_points_to_cp(tune, shipped):
    code, _, err = tune("cat", "echo_single_device")
    assert code == 1 and "'echo_single_device' is a recipe, not a config: `tune cp echo_single_device .`" in err


def test_unknown_config_suggests(tune, shipped):
    code, _, err = tune("cat", "tiny_echo")
    assert code == 1 and "did you mean toy/tiny_echo" in err
