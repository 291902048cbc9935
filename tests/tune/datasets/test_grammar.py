from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import grammar_dataset


def test_input_is_the_prompt_and_output_the_answer(write_json, cache_dir):
    rows = [{"input": "He go home.", "output": "He goes home."}]
    ds = grammar_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
                         train_on_input=True)  # fmt: skip
    tokens = [1, HEADERS["user"], *byte_ids("He go home."), END_OF_TURN,
              HEADERS["assistant"], *byte_ids("He goes home."), END_OF_TURN, 2]  # fmt: skip
    assert ds[0]["tokens"] == tokens
    assert ds[0]["labels"] == tokens  # train_on_input: nothing masked
