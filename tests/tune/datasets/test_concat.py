import pytest

from tests.tune.datasets._helpers import ByteTokenizer
from tune.data import PackedDataset
from tune.datasets import ConcatDataset, instruct_dataset


def _ds(write_json, cache_dir, n, name, **kwargs):
    rows = [{"input": f"{name}{i}", "output": "a"} for i in range(n)]
    return instruct_dataset(ByteTokenizer(max_seq_len=64), source="json", data_files=write_json(rows, f"{name}.json"),
                            cache_dir=cache_dir, **kwargs)  # fmt: skip


def test_indexes_across_datasets(write_json, cache_dir):
    a, b = _ds(write_json, cache_dir, 2, "a"), _ds(write_json, cache_dir, 3, "b")
    both = ConcatDataset([a, b])
    assert len(both) == 5
    assert [both[i] for i in range(5)] == [a[0], a[1], b[0], b[1], b[2]]
    assert both[-1] == b[2]
    with pytest.raises(IndexError):
        both[5]


def test_can_be_packed_as_a_whole(write_json, cache_dir):
    both = ConcatDataset([_ds(write_json, cache_dir, 2, "a"), _ds(write_json, cache_dir, 3, "b")])
    packed = PackedDataset(both, max_seq_len=64)
    stream = [t for i in range(len(both)) for t in both[i]["tokens"]]
    # each pack: its documents' tokens, then padding (0); the packs in order give back every document in order
    packed_stream = []
    packing = packed._packing
    for i in range(len(packed)):
        doc_tokens = int(packing.seg_len[packing.pack_offsets[i] : packing.pack_offsets[i + 1]].sum())
        packed_stream += packed[i]["tokens"][:doc_tokens].tolist()
    assert packed_stream == stream


def test_mixing_packed_and_unpacked_is_an_error(write_json, cache_dir):
    with pytest.raises(ValueError, match="mix of packed and unpacked"):
        ConcatDataset([_ds(write_json, cache_dir, 2, "a"), _ds(write_json, cache_dir, 2, "b", packed=True)])
