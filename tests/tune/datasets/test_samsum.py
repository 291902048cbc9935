from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import samsum_dataset


def test_dialogue_is_the_prompt_and_summary_the_answer(write_json, cache_dir):
    row = {"id": "13818513", "dialogue": "Amanda: cookies?\nJerry: sure!", "summary": "Jerry wants cookies."}
    ds = samsum_dataset(ByteTokenizer(), source="json", data_files=write_json([row]), cache_dir=cache_dir)
    user = [HEADERS["user"], *byte_ids(row["dialogue"]), END_OF_TURN]
    answer = [HEADERS["assistant"], *byte_ids(row["summary"]), END_OF_TURN, 2]
    assert ds[0]["tokens"] == [1, *user, *answer]
    assert ds[0]["labels"] == [-100] * (1 + len(user)) + answer
