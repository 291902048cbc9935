"""tiktoken standing in for ``tokenizers`` on byte-level BPE tokenizer.json files (tune.data._tokenizers._byte_level):
the same ids and masks as ``tokenizers`` itself, and ``tokenizers`` again wherever the engine cannot be exact."""

import json
import logging
import random

import pytest

from tests.tune.data._tiny_tokenizers import qwen_tokenizer_json, random_conversations
from tune.data import Message
from tune.data._tokenizers._byte_level import ByteLevelEngine
from tune.data._tokenizers._huggingface import HuggingFaceBaseTokenizer

# texts that exercise the regex (contractions, digits, whitespace runs, newlines), NFC (a decomposed "é" that NFC
# composes, so byte lengths change), scripts outside the corpus (byte fallback to single bytes) and added tokens
# written inside the text
TRICKY = [
    "Hello world, it's 2024! Don't   stop.\n\n\tTabs\tand  spaces  ",
    "cafe\u0301 au lait: e\u0301te\u0301 vs été",
    "日本語のテキスト and emoji 🙂🙂 mixed",
    "digits 1234567890 3.14159 and ' s 'S 'LL",
    "a<|im_end|>b <|im_start|>user\n inside text <|endoftext|>",
    "   leading spaces\r\n\r\ncarriage returns   ",
    "",
    "x" * 300 + " " * 40 + "y",
]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abc xyz ABC 0123 .,;:!?'\"-\n\t éüñ中文🙂<|>\u0301"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(count)]


@pytest.fixture(params=[False, True], ids=["qwen2_5", "qwen3"])
def hf(request):
    return HuggingFaceBaseTokenizer(qwen_tokenizer_json(qwen3=request.param))


def test_engine_gives_the_ids_of_tokenizers(hf):
    engine = hf._byte_level_engine()
    assert engine is not None  # a Qwen-style tokenizer.json is one the engine stands in for
    texts = TRICKY + _random_texts(300, seed=1)
    reference = [e.ids for e in hf._chat.encode_batch(texts, add_special_tokens=False)]
    assert engine.encode_batch(texts) == reference
    for text, ids in zip(texts, reference):
        if engine.token_bytes.tiles(text):  # tokens tile the text's bytes, except where NFC changed the text
            assert sum(int(engine.token_bytes.table[i]) for i in ids) == len(text.encode("utf-8"))
        else:
            assert "\u0301" in text


def _messages(conversation: list[Message]) -> list[Message]:
    # content with the tricky texts, so conversations mix NFC changes and added tokens with the masks
    rng = random.Random(len(conversation))
    return [Message(m.role, m.text_content + rng.choice(TRICKY), masked=m.masked) for m in conversation]


@pytest.mark.parametrize("qwen3", [False, True], ids=["qwen2_5", "qwen3"])
def test_conversations_match_the_tokenizers_path(qwen3):
    from tune.models.qwen2_5 import qwen2_5_tokenizer
    from tune.models.qwen3 import qwen3_tokenizer

    build = qwen3_tokenizer if qwen3 else qwen2_5_tokenizer
    path = qwen_tokenizer_json(qwen3=qwen3)
    fast, slow = build(str(path)), build(str(path))
    slow.tokenizer._engine = None  # the tokenizers path: one encode of the whole rendered text, char offsets
    conversations = [_messages(c) for c in random_conversations(count=60, seed=3)]
    assert fast.tokenizer._byte_level_engine() is not None
    assert fast.tokenize_messages_batch(conversations) == slow.tokenize_messages_batch(conversations)
    open_ended = [c[:-1] for c in conversations if len(c) > 1]
    assert fast.tokenize_messages_batch(open_ended, add_end_tokens=False) == slow.tokenize_messages_batch(
        open_ended, add_end_tokens=False
    )


def test_disagreement_falls_back_to_tokenizers(hf, caplog, monkeypatch):
    conversations = [_messages(c) for c in random_conversations(count=10, seed=5)]
    segments = [[s for m in c for s in [*_render(m)]] for c in conversations]
    expected = HuggingFaceBaseTokenizer.encode_segments_batch(_without_engine(hf), segments)
    engine = hf._byte_level_engine()
    monkeypatch.setattr(
        engine, "encode_batch", lambda texts: [[0] + ids for ids in ByteLevelEngine.encode_batch(engine, texts)]
    )
    with caplog.at_level(logging.WARNING):
        assert hf.encode_segments_batch(segments) == expected
    assert "disagree" in caplog.text and hf._byte_level_engine() is None


def _render(message: Message):
    from tune.data._chat_formats import Segment

    yield Segment("<|im_start|>", message.masked, special=True)
    yield Segment(f"{message.role}\n{message.text_content}", not message.masked)
    yield Segment("<|im_end|>", not message.masked, special=True)


def _without_engine(hf):
    clone = HuggingFaceBaseTokenizer.__new__(HuggingFaceBaseTokenizer)
    clone.__setstate__(hf.__getstate__())
    clone._engine = None
    return clone


def _edited(hf, edit) -> object:
    from tokenizers import Tokenizer

    spec = json.loads(hf._chat.to_str())
    edit(spec)
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s["model"]["merges"].reverse(),  # merges out of id order: ranks would not be merge priorities
        lambda s: s.update(normalizer={"type": "NFKC"}),
        lambda s: s["model"].update(dropout=0.1),
        lambda s: s["added_tokens"][0].update(rstrip=True),  # an added token that swallows spaces
        lambda s: s["pre_tokenizer"]["pretokenizers"][1].update(use_regex=True),
    ],
    ids=["merge-order", "nfkc", "dropout", "rstrip", "byte-level-regex"],
)
def test_engine_declines_what_it_cannot_reproduce(hf, edit):
    assert ByteLevelEngine.for_tokenizer(hf._chat) is not None
    assert ByteLevelEngine.for_tokenizer(_edited(hf, edit)) is None


def test_pickled_state_does_not_change_with_the_engine(hf):
    import pickle

    before = pickle.dumps(hf.__getstate__())
    hf._byte_level_engine()
    assert pickle.dumps(hf.__getstate__()) == before  # the datasets cache key does not depend on first use
    clone = pickle.loads(pickle.dumps(hf))
    assert clone._byte_level_engine() is not None


def test_the_check_goes_on_after_the_first_texts(hf, caplog, monkeypatch):
    # past its first texts the engine is still checked, on one text in every CHECK_EVERY: a difference there drops
    # it too (and that batch comes from tokenizers)
    from tune.data._tokenizers._byte_level import CHECK_EVERY

    conversations = [_messages(c) for c in random_conversations(count=10, seed=6)]
    segments = [[s for m in c for s in _render(m)] for c in conversations]
    expected = HuggingFaceBaseTokenizer.encode_segments_batch(_without_engine(hf), segments)
    engine = hf._byte_level_engine()
    assert hf.encode_segments_batch(segments) == expected  # the first texts: checked, and equal
    engine.texts_seen = 5 * CHECK_EVERY - 1  # the batch's second text is the next one checked
    real = ByteLevelEngine.encode_batch
    monkeypatch.setattr(engine, "encode_batch", lambda texts: [[0] + ids for ids in real(engine, texts)])
    with caplog.at_level(logging.WARNING):
        assert hf.encode_segments_batch(segments) == expected
    assert "disagree" in caplog.text and hf._byte_level_engine() is None
