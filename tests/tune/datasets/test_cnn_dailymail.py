from tests.tune.datasets._helpers import ByteTokenizer, byte_ids
from tune.datasets import cnn_dailymail_articles_dataset


def test_articles_only(write_json, cache_dir):
    rows = [{"article": "LONDON (CNN) -- News.", "highlights": "Not used.", "id": "42"}]
    ds = cnn_dailymail_articles_dataset(ByteTokenizer(), source="json", data_files=write_json(rows),
                                        cache_dir=cache_dir)  # fmt: skip
    assert len(ds) == 1
    assert ds[0]["tokens"] == ds[0]["labels"] == [1, *byte_ids("LONDON (CNN) -- News."), 2]
