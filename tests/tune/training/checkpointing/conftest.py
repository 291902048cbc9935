import pytest

from tests.tune.training.checkpointing import tiny_llama


@pytest.fixture(autouse=True, scope="module")
def _tiny_family():
    # registered for each test module and removed after it: a test file that lists the registry's families
    # (tests/tune/test_registry.py) may run next in the same process
    tiny_llama.register()
    yield
    from tune import registry

    registry._FAMILIES.pop(tiny_llama.FAMILY, None)


@pytest.fixture
def hf_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    tiny_llama.make_hf_checkpoint(directory)
    return directory
