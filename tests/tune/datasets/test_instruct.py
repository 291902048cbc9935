import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import PackedDataset, instruct_dataset


def test_tokens_and_labels_exact(write_json, cache_dir):
    data = write_json([{"q": "Hi?", "a": "Yo."}])
    ds = instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir,
                          column_map={"input": "q", "output": "a"}, new_system_prompt="Sys")  # fmt: skip
    system = [HEADERS["system"], *byte_ids("Sys"), END_OF_TURN]
    user = [HEADERS["user"], *byte_ids("Hi?"), END_OF_TURN]
    answer = [HEADERS["assistant"], *byte_ids("Yo."), END_OF_TURN, 2]
    assert ds[0]["tokens"] == [1, *system, *user, *answer]
    assert ds[0]["labels"] == [-100] * (1 + len(system) + len(user)) + answer


def test_train_on_input_keeps_system_prompt_masked(write_json, cache_dir):
    data = write_json([{"input": "Hi?", "output": "Yo."}])
    ds = instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir,
                          train_on_input=True, new_system_prompt="Sys")  # fmt: skip
    n_system = 1 + 1 + 3 + 1  # BOS (takes the first turn's mask), header, "Sys", <end>
    assert ds[0]["labels"][:n_system] == [-100] * n_system
    assert ds[0]["labels"][n_system:] == ds[0]["tokens"][n_system:]


def test_packed_needs_max_seq_len(write_json, cache_dir):
    data = write_json([{"input": "Hi?", "output": "Yo."}])
    with pytest.raises(ValueError, match="packed=True needs the tokenizer's max_seq_len"):
        instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir, packed=True)
    ds = instruct_dataset(ByteTokenizer(max_seq_len=64), source="json", data_files=data, cache_dir=cache_dir,
                          packed=True)  # fmt: skip
    assert isinstance(ds, PackedDataset)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "directory", "file", "saved"])
def test_sources(tmp_path, cache_dir, fmt):
    import datasets

    table = datasets.Dataset.from_list([{"input": "Hi?", "output": "Yo."}, {"input": "A?", "output": "B."}])
    folder = tmp_path / "data"
    folder.mkdir()
    if fmt == "parquet":
        table.to_parquet(str(folder / "x.parquet"))
        kwargs = {"source": "parquet", "data_files": str(folder / "x.parquet")}
    elif fmt == "csv":
        table.to_csv(str(folder / "x.csv"), index=False)
        kwargs = {"source": "csv", "data_files": str(folder / "x.csv")}
    elif fmt == "directory":
        table.to_json(str(folder / "x.jsonl"))
        kwargs = {"source": str(folder)}
    elif fmt == "file":
        table.to_json(str(folder / "x.jsonl"))
        kwargs = {"source": str(folder / "x.jsonl")}
    else:
        table.save_to_disk(str(folder / "saved"))
        kwargs = {"source": str(folder / "saved")}
    ds = instruct_dataset(ByteTokenizer(), cache_dir=cache_dir, **kwargs)
    assert len(ds) == 2 and ds[1]["tokens"][2:4] == byte_ids("A?")
