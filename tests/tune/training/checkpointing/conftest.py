import pytest

from tests.tune.training.checkpointing import tiny_llama


@pytest.fixture(autouse=True, scope="session")
def _tiny_family():
    tiny_llama.register()
    yield
    from tune import registry

    registry._FAMILIES.pop(tiny_llama.FAMILY, None)  # leave the registry as other test files expect it


@pytest.fixture
def hf_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    tiny_llama.make_hf_checkpoint(directory)
    return directory
