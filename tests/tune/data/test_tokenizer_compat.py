import json

import pytest

import tune.data
import tune.modules.transforms.tokenizers as torchtune_path
from tests.tune.data import _tiny_tokenizers as tiny
from tune.data import Message
from tune.models.llama2 import llama2_tokenizer
from tune.modules.transforms.tokenizers import (
    GPT2BaseTokenizer,
    parse_hf_tokenizer_json,
    tokenize_messages_no_special_tokens,
)


def test_torchtune_path_names_are_tune_data_classes():
    for name in ("BaseTokenizer", "ModelTokenizer", "SentencePieceBaseTokenizer", "TikTokenBaseTokenizer",
                 "HuggingFaceBaseTokenizer"):  # fmt: skip
        assert getattr(torchtune_path, name) is getattr(tune.data, name)


@pytest.fixture
def gpt2_files(tmp_path):
    """A vocab.json of GPT-2's 256 byte characters plus nine merges (spelling "hello" and " world")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]
    vocab = {c: i for i, c in enumerate(chars)}
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
    for merge in merges:
        vocab[merge.replace(" ", "")] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")


@pytest.mark.parametrize(
    "text, ids, pieces",
    # torchtune 0.6.1's GPT2BaseTokenizer(vocab, merges, unk_id=0, bos_id=1, eos_id=2, pad_id=3) on the same files,
    # run once in its own environment
    [
        ("hello world", [1, 259, 264, 2], ["hello", "Ġworld"]),
        ("Hello, world! 42 héllo", [1, 39, 68, 257, 78, 11, 264, 0, 220, 19, 17, 220, 71, 127, 102, 257, 78, 2],
         ["H", "e", "ll", "o", ",", "Ġworld", "!", "Ġ", "4", "2", "Ġ", "h", "Ã", "©", "ll", "o"]),
        ("hello  world\n", [1, 259, 220, 264, 198, 2], ["hello", "Ġ", "Ġworld", "Ċ"]),
    ],
)  # fmt: skip
def test_gpt2_tokenizer_matches_torchtune(gpt2_files, text, ids, pieces):
    tok = GPT2BaseTokenizer(*gpt2_files, unk_id=0, bos_id=1, eos_id=2, pad_id=3)
    assert tok.encode(text) == ids
    assert tok.encode(text, add_bos=False, add_eos=False) == ids[1:-1]
    assert tok.decode(ids[1:-1]) == pieces


def test_parse_hf_tokenizer_json():
    path = tiny.qwen_tokenizer_json() / "tokenizer.json"
    added = json.loads(path.read_text())["added_tokens"]
    parsed = parse_hf_tokenizer_json(str(path))
    assert parsed["<|im_end|>"] == next(t["id"] for t in added if t["content"] == "<|im_end|>")
    assert len(parsed) == len(added)


def test_no_special_tokens_layout_matches_torchtune_rule():
    model = tiny.sentencepiece_model() / "tokenizer.model"
    tok = llama2_tokenizer(str(model), prompt_template=None)
    messages = [
        Message("system", "You are helpful. ", masked=True),
        Message("user", "What is the capital of France?", masked=True),
        Message("assistant", "Paris."),
        Message("user", "Why?", masked=True),
        Message("assistant", "It is the capital city."),
    ]
    expected = tiny.torchtune_no_template_reference(model, messages)
    assert tokenize_messages_no_special_tokens(tok, messages, bos_id=tok.bos_id, eos_id=tok.eos_id) == expected
    tokens, mask = tokenize_messages_no_special_tokens(tok, messages)
    assert tokens == [t for t in expected[0] if t not in (tok.bos_id, tok.eos_id)]
