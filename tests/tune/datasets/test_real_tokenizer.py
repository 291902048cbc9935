"""The datasets with a real family tokenizer (tune.models.llama2's SentencePiece tokenizer and chat format)."""

import os

from tune.data import AlpacaToMessages, render_sample
from tune.datasets import PackedDataset, alpaca_dataset
from tune.models.llama2._tokenizer import llama2_tokenizer

ROWS = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The answer is 5."},
    {"instruction": "Say hello.", "input": "", "output": "Hello world."},
    {"instruction": "Explain why.", "input": "", "output": "Because of the question."},
]


def test_alpaca_with_llama2_tokenizer_masks_exactly_the_prompt(sentencepiece_path, write_json, cache_dir):
    tok = llama2_tokenizer(sentencepiece_path, max_seq_len=256)
    ds = alpaca_dataset(tok, source="json", data_files=write_json(ROWS), cache_dir=cache_dir, train_on_input=False)
    for i, row in enumerate(ROWS):
        tokens, mask = tok.tokenize_messages(AlpacaToMessages(train_on_input=False)(row)["messages"])
        assert ds[i]["tokens"] == tokens
        assert ds[i]["labels"] == [-100 if m else t for t, m in zip(tokens, mask)]
        trained = [t for t in ds[i]["labels"] if t != -100]
        assert tok.decode(trained).strip() == row["output"]  # the answer (and its EOS) is what is trained
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
        rendered = render_sample(ds[i]["tokens"], ds[i]["labels"], decode)
        assert rendered.endswith("]]") and "[[" in rendered and row["output"] in rendered.split("[[", 1)[1]


def test_cache_is_reused_and_processes_agree(sentencepiece_path, write_json, cache_dir, tmp_path):
    data = write_json(ROWS * 20)
    first = alpaca_dataset(llama2_tokenizer(sentencepiece_path, max_seq_len=64), source="json", data_files=data,
                           cache_dir=cache_dir)  # fmt: skip
    files = [f["filename"] for f in first._data.cache_files]
    mtimes = [os.path.getmtime(f) for f in files]
    # a new tokenizer object from the same file: same identity, so the cached Arrow file is read, not rewritten
    second = alpaca_dataset(llama2_tokenizer(sentencepiece_path, max_seq_len=64), source="json", data_files=data,
                            cache_dir=cache_dir)  # fmt: skip
    assert [f["filename"] for f in second._data.cache_files] == files
    assert [os.path.getmtime(f) for f in files] == mtimes
    two_procs = alpaca_dataset(llama2_tokenizer(sentencepiece_path, max_seq_len=64), source="json", data_files=data,
                               cache_dir=str(tmp_path / "other"), num_proc=2)  # fmt: skip
    assert [two_procs[i] for i in range(60)] == [first[i] for i in range(60)]


def test_packed_with_llama2_tokenizer(sentencepiece_path, write_json, cache_dir):
    tok = llama2_tokenizer(sentencepiece_path, max_seq_len=128)
    ds = alpaca_dataset(tok, source="json", data_files=write_json(ROWS), cache_dir=cache_dir, packed=True)
    assert isinstance(ds, PackedDataset)
    pack = ds[0]
    assert pack["tokens"].shape == (128,) and int(pack["seq_lens"].sum()) == 128
