"""A dataset component for the KTO recipe tests: unpaired examples given as token ids (a JSON list of rows with
``input_ids``, ``labels`` and ``label``), so that the recipe and a reference trainer see exactly the same tokens;
the KL rows are built by ``tune.datasets.UnpairedPreferenceDataset`` as for any unpaired data."""

import json
from pathlib import Path

from tune.datasets import UnpairedPreferenceDataset


def token_examples(tokenizer, path: str, kl_group_size: int | None = None) -> UnpairedPreferenceDataset:
    """The dataset builder the configs name (``kto_components.token_examples``); the tokenizer is not used."""
    return UnpairedPreferenceDataset(json.loads(Path(path).read_text()), kl_group_size=kl_group_size)
