from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import slimorca_dataset


def _row(system: str) -> dict:
    # SlimOrca-Dedup's layout: ShareGPT turns with a (null) weight
    turns = [("system", system), ("human", "Hi?"), ("gpt", "Yo.")]
    return {"conversations": [{"from": f, "value": v, "weight": None} for f, v in turns]}


def test_tokens_and_labels(write_json, cache_dir):
    ds = slimorca_dataset(ByteTokenizer(), source="json", data_files=write_json([_row("Sys"), _row("")]),
                          cache_dir=cache_dir)  # fmt: skip
    system = [HEADERS["system"], *byte_ids("Sys"), END_OF_TURN]
    user = [HEADERS["user"], *byte_ids("Hi?"), END_OF_TURN]
    answer = [HEADERS["assistant"], *byte_ids("Yo."), END_OF_TURN, 2]
    assert ds[0]["tokens"] == [1, *system, *user, *answer]
    assert ds[0]["labels"] == [-100] * (1 + len(system) + len(user)) + answer
    # an empty system turn is dropped
    assert ds[1]["tokens"] == [1, *user, *answer]


def test_train_on_input_and_new_system_prompt(write_json, cache_dir):
    ds = slimorca_dataset(ByteTokenizer(), source="json", data_files=write_json([_row("Sys")]), cache_dir=cache_dir,
                          train_on_input=True, new_system_prompt="New")  # fmt: skip
    system = [1, HEADERS["system"], *byte_ids("New"), END_OF_TURN]
    assert ds[0]["tokens"][: len(system)] == system
    assert ds[0]["labels"] == [-100] * len(system) + ds[0]["tokens"][len(system) :]
