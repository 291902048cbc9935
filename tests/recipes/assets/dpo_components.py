"""A dataset component for the DPO recipe tests: preference pairs given as token ids (a JSON list of rows with
``chosen_input_ids``, ``chosen_labels``, ``rejected_input_ids``, ``rejected_labels``), so that the recipe and a
reference trainer see exactly the same tokens whatever tokenizer produced them."""

import json
from pathlib import Path

from torch.utils.data import Dataset


class TokenPairs(Dataset):
    """The rows of ``path``, as they are."""

    def __init__(self, rows: list[dict]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict:
        return self._rows[index]


def token_pairs(tokenizer, path: str) -> TokenPairs:
    """The dataset builder the configs name (``dpo_components.token_pairs``); the tokenizer is not used."""
    return TokenPairs(json.loads(Path(path).read_text()))
