from tests.tune.datasets._helpers import ByteTokenizer, byte_ids
from tune.datasets import PackedDataset, wikitext_dataset


def test_each_page_is_one_sample(write_json, cache_dir):
    rows = [{"page": " = Valkyria = \n Senjō no Valkyria 3 ."}, {"page": "Short."}]
    ds = wikitext_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir)
    assert ds[0]["tokens"] == ds[0]["labels"] == [1, *byte_ids(rows[0]["page"]), 2]
    assert ds[1]["tokens"] == [1, *byte_ids("Short."), 2]


def test_max_seq_len_cuts_and_packing(write_json, cache_dir):
    data = write_json([{"page": "abcdefgh"}])
    ds = wikitext_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir, max_seq_len=4)
    assert ds[0]["tokens"] == [1, *byte_ids("abc")]
    packed = wikitext_dataset(ByteTokenizer(max_seq_len=4), source="json", data_files=data, cache_dir=cache_dir,
                              packed=True)  # fmt: skip
    assert isinstance(packed, PackedDataset)
