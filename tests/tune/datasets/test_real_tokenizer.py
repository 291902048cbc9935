"""The datasets with a real family tokenizer (tune.models.llama2's SentencePiece tokenizer and chat format)."""

import os

import pytest

from tests.tune.data._tiny_tokenizers import sentencepiece_model
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


# Rows that exercise torchtune's no-template rule: an answer with a leading space, trailing spaces (stripped),
# newlines, accents, an input section or none.
TORCHTUNE_ROWS = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The answer is 5."},
    {"instruction": "Say hello.", "input": "", "output": " Hello world.  "},
    {"instruction": "Explain why.  ", "input": "café au lait", "output": "Because:\n- one\n- two"},
    {"instruction": "Count.", "input": "", "output": "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"},
]


def _torchtune_alpaca(path, row: dict, train_on_input: bool) -> tuple[list[int], list[int]]:
    """torchtune 0.6.1's alpaca_dataset with llama2_tokenizer(prompt_template=None): the Alpaca prompt as a user
    message (masked unless train_on_input), the output as the assistant message, laid out by the no-template rule;
    labels are the tokens with masked positions set to -100."""
    from tests.tune.data._tiny_tokenizers import torchtune_no_template_reference
    from tune.data import Message, alpaca_prompt

    messages = [
        Message("user", alpaca_prompt(row["instruction"], row["input"]), masked=not train_on_input),
        Message("assistant", row["output"]),
    ]
    tokens, mask = torchtune_no_template_reference(path, messages)
    return tokens, [-100 if m else t for t, m in zip(tokens, mask)]


@pytest.mark.parametrize("train_on_input", [True, False])
def test_alpaca_without_template_matches_torchtune(write_json, cache_dir, train_on_input):
    path = sentencepiece_model() / "tokenizer.model"
    tok = llama2_tokenizer(str(path), max_seq_len=512, prompt_template=None)
    ds = alpaca_dataset(tok, source="json", data_files=write_json(TORCHTUNE_ROWS), cache_dir=cache_dir,
                        train_on_input=train_on_input)  # fmt: skip
    for i, row in enumerate(TORCHTUNE_ROWS):
        tokens, labels = _torchtune_alpaca(path, row, train_on_input)
        assert (ds[i]["tokens"], ds[i]["labels"]) == (tokens, labels)


def test_alpaca_truncation_without_template(write_json, cache_dir):
    # torchtune cuts to max_seq_len and forces the last token to EOS, which keeps the mask of the token it replaced
    # (its Llama 2 tokenizer: trained inside the answer); so does llama2_tokenizer, torchtune's name
    path = sentencepiece_model() / "tokenizer.model"
    tok = llama2_tokenizer(str(path), max_seq_len=40, prompt_template=None)
    ds = alpaca_dataset(tok, source="json", data_files=write_json(TORCHTUNE_ROWS), cache_dir=cache_dir)
    for i, row in enumerate(TORCHTUNE_ROWS):
        tokens, labels = _torchtune_alpaca(path, row, True)
        assert len(tokens) > 40  # every row is cut
        assert ds[i]["tokens"] == tokens[:39] + [tok.eos_id]
        assert labels[39] != -100  # train_on_input: the replaced token was trained, and so is the EOS
        assert ds[i]["labels"] == labels[:39] + [tok.eos_id]
