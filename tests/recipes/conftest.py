"""Session fixtures of the recipe integration tests (helpers live in tests/recipes/utils.py)."""

import os

import pytest

from tests.recipes.utils import build_tiny_assets


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """A directory holding ``tokenizer.model``, ``train.json``, ``val.json`` and ``llama/`` (HF checkpoint)."""
    root = tmp_path_factory.mktemp("tiny_assets")
    # tokenised datasets are cached by `datasets`: keep the cache inside the test's temporary directory
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    return build_tiny_assets(root)
