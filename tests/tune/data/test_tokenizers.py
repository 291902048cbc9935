"""Text tokenizers (SentencePiece, tiktoken, tokenizer.json) and truncation; every family's chat parity lives in
tests/tune/models/test_family_tokenizers.py."""

import json
import os
import random

import pytest

from tests.tune.data._tiny_tokenizers import qwen_tokenizer_json, sentencepiece_model, tiktoken_file
from tune.data import HuggingFaceBaseTokenizer, SentencePieceBaseTokenizer, TikTokenBaseTokenizer, truncate
from tune.data._chat_formats import Segment
from tune.data._tokenizers import load_tiktoken_ranks
from tune.data._tokenizers._tiktoken import _split_long
from tune.data._tokenizers._utils import (
    _length_flags,
    byte_runs,
    encode_chunked_batch,
    flags_from_lengths,
    flags_from_lengths_batch,
    token_flags,
)
from tune.models.llama3._tokenizer import LLAMA3_PATTERN

TEXT = "Hello world, café 12345 naïve!\n\n  two spaces"


@pytest.fixture(scope="module")
def sp():
    return SentencePieceBaseTokenizer(sentencepiece_model() / "tokenizer.model")


@pytest.fixture(scope="module")
def tiktoken_tokenizer():
    num_base = len(load_tiktoken_ranks(tiktoken_file()))
    special = {"<|bos|>": num_base, "<|eos|>": num_base + 1}
    return TikTokenBaseTokenizer(tiktoken_file(), "tiny", LLAMA3_PATTERN, num_base, num_base + 1, special)


@pytest.fixture(scope="module")
def hf():
    return HuggingFaceBaseTokenizer(qwen_tokenizer_json())


class TestSentencePiece:
    def test_word_cache_encodes_exactly_like_whole_texts(self, sp, tmp_path):
        # Batches of 64+ texts are encoded word by word from a cache when the model allows it (a Llama 2-style BPE
        # model does); the ids must be those of encoding every text whole, also for the texts the cache leaves
        # whole (leading space, runs of spaces, a literal "▁") and for words seen in an earlier batch.
        import random

        from tests.tune.data._tiny_tokenizers import corpus

        rng = random.Random(1)
        gaps = [" ", " ", " ", "  ", "\n", " \n", "\t", "\u2581", " \u2581 "]
        lines = list(corpus())
        texts = []
        for _ in range(300):
            words = rng.choice(lines).split(" ") + ["😀", "naïve", "42", "x"]
            rng.shuffle(words)
            text = "".join(w + rng.choice(gaps) for w in words[: rng.randint(1, 12)])
            texts.append(rng.choice(["", " ", "\n", "  "]) + text + rng.choice(["", " ", "\n"]))
        assert sp._by_words and sp._dummy_prefix
        expected = [sp._sp.encode(text) for text in texts]
        assert sp._encode_batch(texts[:150]) == expected[:150]
        assert sp._encode_batch(texts) == expected  # half the words now come from the cache
        assert sp._later_words and "_later_words" not in sp.__getstate__()  # never part of a pickle or cache key
        # Gemma's model: no dummy prefix, and user-defined pieces (<start_of_turn>, matched before merging, also
        # inside a word: such texts are encoded whole)
        gemma = SentencePieceBaseTokenizer(sentencepiece_model(False, True) / "tokenizer.model")
        assert gemma._by_words and not gemma._dummy_prefix and "<start_of_turn>" in gemma._user_pieces
        marked = [t.replace("x", "x<start_of_turn>", 1) if i % 7 == 0 else t for i, t in enumerate(texts)]
        expected = [gemma._sp.encode(text) for text in marked]
        assert gemma._encode_batch(marked[:150]) == expected[:150]
        assert gemma._encode_batch(marked) == expected
        assert any("<start_of_turn>" in t for t in marked) and gemma._later_words
        # Llama 2's vocabulary has whitespace-only pieces ("▁▁", "▁▁▁▁") that merge across single spaces: so does
        # this one, trained on indented text, and its runs of spaces must still encode exactly
        indented = self._indented_model(tmp_path, lines)
        assert indented._by_words and indented.token_id("▁▁▁▁")  # token_id raises for a piece it lacks
        expected = [indented._sp.encode(text) for text in texts]
        assert indented._encode_batch(texts) == expected

    @staticmethod
    def _indented_model(tmp_path, lines):
        import sentencepiece as spm

        indented = [" " * (4 * (i % 4)) + line.replace(" ", "  " * (i % 3 == 0) or " ") for i, line in enumerate(lines)]
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(indented), model_prefix=str(tmp_path / "indented"), vocab_size=400,
            model_type="bpe", byte_fallback=True, add_dummy_prefix=True, remove_extra_whitespaces=False,
            normalization_rule_name="identity", allow_whitespace_only_pieces=True, split_digits=True,
            character_coverage=1.0, minloglevel=2,
        )  # fmt: skip
        return SentencePieceBaseTokenizer(tmp_path / "indented.model")

    def test_encode_decode_round_trip(self, sp):
        ids = sp.encode(TEXT)
        assert ids[0] == sp.bos_id == 1 and ids[-1] == sp.eos_id == 2
        assert sp.encode(TEXT, add_bos=False, add_eos=False) == ids[1:-1]
        assert sp.decode(ids) == TEXT
        assert sp.decode(ids, skip_special_tokens=False) == "<s>" + TEXT + "</s>"
        assert sp.pad_id == 0  # the model has no pad piece (pad_id -1): 0 as Llama 2 uses

    def test_trim_leading_whitespace_drops_the_dummy_prefix(self, sp):
        # "▁" alone is a piece here (the dummy prefix before a digit): trimming removes exactly it
        ids = sp.encode("42", add_bos=False, add_eos=False)
        assert sp._sp.id_to_piece(ids[0]) == "▁"
        assert sp.encode("42", add_bos=False, add_eos=False, trim_leading_whitespace=True) == ids[1:]

    def test_offsets_cover_the_text(self, sp):
        ids, offsets = sp.encode_with_offsets(TEXT)
        assert ids == sp.encode(TEXT, add_bos=False, add_eos=False)
        # UTF-8 byte spans, ordered and non-overlapping ("é" and "ï" are two bytes each)
        assert offsets[0][0] == 0 and offsets[-1][1] == len(TEXT.encode("utf-8")) == len(TEXT) + 2
        assert all(a[1] <= b[0] for a, b in zip(offsets, offsets[1:]))

    def test_errors_name_the_problem(self, sp, tmp_path):
        with pytest.raises(FileNotFoundError, match="SentencePiece model not found"):
            SentencePieceBaseTokenizer(tmp_path / "missing.model")
        with pytest.raises(ValueError, match="not in this SentencePiece model"):
            sp.token_id("<|not-a-piece|>")

    def test_added_special_tokens_beyond_the_vocabulary(self):
        path = sentencepiece_model() / "tokenizer.model"
        tok = SentencePieceBaseTokenizer(path, special_tokens={"<|end|>": 480})
        assert tok.vocab_size == 481 and tok.token_id("<|end|>") == 480
        ids = tok.encode("hi", add_bos=False, add_eos=False) + [480]
        assert tok.decode(ids) == "hi" and tok.decode(ids, skip_special_tokens=False) == "hi<|end|>"


class TestTikToken:
    def test_file_format(self):
        ranks = load_tiktoken_ranks(tiktoken_file())
        assert all(ranks[bytes([b])] == b for b in range(256))  # the 256 single bytes come first
        assert sorted(ranks.values()) == list(range(len(ranks)))

    def test_encode_decode_round_trip(self, tiktoken_tokenizer):
        tok = tiktoken_tokenizer
        ids = tok.encode(TEXT)
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert tok.decode(ids) == TEXT
        assert tok.decode(ids, skip_special_tokens=False) == "<|bos|>" + TEXT + "<|eos|>"
        # special-token strings in text are text
        assert tok.bos_id not in tok.encode("<|bos|>", add_bos=False, add_eos=False)

    def test_long_runs_are_split_and_still_round_trip(self, tiktoken_tokenizer):
        text = "a" * 30_000 + " " * 30_000 + "end"
        pieces = _split_long(text)
        assert "".join(pieces) == text and len(pieces) > 2
        assert tiktoken_tokenizer.decode(tiktoken_tokenizer.encode(text)) == text

    def test_offsets_are_contiguous_byte_spans(self, tiktoken_tokenizer):
        ids, offsets = tiktoken_tokenizer.encode_with_offsets("é😀x")
        assert tiktoken_tokenizer.decode(ids) == "é😀x"
        # 2 + 4 + 1 UTF-8 bytes, covered without gaps (a token may hold part of a character)
        assert offsets[0][0] == 0 and offsets[-1][1] == 7
        assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))

    def test_malformed_file_names_the_line(self, tmp_path):
        bad = tmp_path / "tokenizer.model"
        bad.write_text("YQ== 0\nnot base64!! x\n")
        with pytest.raises(ValueError, match=r"tokenizer.model:2 is not a tiktoken BPE line"):
            load_tiktoken_ranks(bad)
        with pytest.raises(FileNotFoundError, match="tiktoken BPE file not found"):
            load_tiktoken_ranks(tmp_path / "absent")


class TestHuggingFace:
    def test_ids_from_tokenizer_config(self, hf):
        assert hf.bos_id is None
        assert hf.eos_id == hf.token_id("<|im_end|>") and hf.pad_id == hf.token_id("<|endoftext|>")

    def test_generation_config_fallback_and_file_path(self, tmp_path):
        directory = qwen_tokenizer_json()
        (tmp_path / "tokenizer.json").write_text((directory / "tokenizer.json").read_text())
        (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 7, "eos_token_id": [5, 6]}))
        tok = HuggingFaceBaseTokenizer(tmp_path / "tokenizer.json")
        assert (tok.bos_id, tok.eos_id, tok.pad_id) == (7, 5, None)

    def test_encode_decode(self, hf):
        text = TEXT + " <|im_end|>"
        ids = hf.encode(text, add_eos=False)
        assert hf.token_id("<|im_end|>") not in ids  # plain-text encode does not parse special tokens
        assert hf.decode(ids) == text
        assert hf.encode("x")[-1] == hf.eos_id

    def test_errors(self, hf, tmp_path):
        with pytest.raises(FileNotFoundError, match="tokenizer.json not found"):
            HuggingFaceBaseTokenizer(tmp_path)
        with pytest.raises(ValueError, match="not in the vocabulary"):
            hf.token_id("<|nope|>")


def test_truncate():
    assert truncate([1, 2, 3, 4], 3) == [1, 2, 3]
    assert truncate([1, 2, 3, 4], 3, eos_id=9) == [1, 2, 9]
    assert truncate([1, 2], 3, eos_id=9) == [1, 2]  # not cut: EOS is not forced
    with pytest.raises(ValueError, match="positive integer"):
        truncate([1], 0)


def test_token_flags_rule():
    flags = bytearray([0, 0, 1, 1, 0])
    # a token overlapping a trained character is trained; an empty span takes the flag where it sits
    assert token_flags([(0, 2), (1, 3), (4, 5), (2, 2), (5, 5)], flags) == [False, True, False, True, False]


def test_flags_from_lengths_follow_the_token_flags_rule():
    # the same rule from token lengths (tokens tiling the text) and runs of flags, against token_flags itself
    rng = random.Random(0)
    for _ in range(500):
        runs, end = [], 0
        for _ in range(rng.randint(1, 5)):
            end += rng.randint(1, 6)
            runs.append((end, rng.random() < 0.5))
        flags = bytearray()
        start = 0
        for run_end, trained in runs:
            flags.extend([trained] * (run_end - start))
            start = run_end
        lengths, total = [], 0
        while total < end:  # empty tokens anywhere, last token may not reach past the end
            length = min(rng.choice([0, 1, 1, 2, 3, 5]), end - total)
            lengths.append(length)
            total += length
        offsets = [(sum(lengths[:i]), sum(lengths[: i + 1])) for i in range(len(lengths))]
        expected = token_flags(offsets, flags)
        assert flags_from_lengths(lengths, runs) == expected, (lengths, runs)  # the batch implementation
        assert list(map(bool, _length_flags(lengths, runs))) == expected, (lengths, runs)  # the few-texts one
    assert byte_runs([Segment("ab", False), Segment("é", True)]) == ("abé", [(2, False), (4, True)])


def test_tiktoken_pickles_compactly_with_a_stable_identity(tiktoken_tokenizer, tmp_path):
    # datasets pickles the tokenizer to each worker process and hashes it for the cache key: both go through the
    # packed ranks (three buffers), which must give back the same tokenizer and change when a rank changes
    import pickle

    from tune.datasets._hf import tokenizer_identity

    clone = pickle.loads(pickle.dumps(tiktoken_tokenizer))
    assert clone.encode(TEXT) == tiktoken_tokenizer.encode(TEXT)
    assert clone.decode(clone.encode(TEXT)) == TEXT
    assert (
        clone.vocab_size == tiktoken_tokenizer.vocab_size and clone.special_tokens == tiktoken_tokenizer.special_tokens
    )
    assert pickle.loads(pickle.dumps(clone)).encode(TEXT) == clone.encode(TEXT)  # a clone pickles again
    ranks = load_tiktoken_ranks(tiktoken_file())
    fresh = TikTokenBaseTokenizer(
        tiktoken_file(), "tiny", LLAMA3_PATTERN, len(ranks), len(ranks) + 1, tiktoken_tokenizer.special_tokens
    )
    assert tokenizer_identity(clone) == tokenizer_identity(tiktoken_tokenizer) == tokenizer_identity(fresh)
    lines = tiktoken_file().read_text().splitlines()
    token, rank = lines[-1].split()
    changed = tmp_path / "changed.model"
    changed.write_text("\n".join(lines[:-1] + [f"{token} {int(rank) + 1}"]) + "\n")  # one rank differs
    other = TikTokenBaseTokenizer(
        changed, "tiny", LLAMA3_PATTERN, len(ranks) + 1, len(ranks) + 2,
        {"<|bos|>": len(ranks) + 1, "<|eos|>": len(ranks) + 2},
    )  # fmt: skip
    other_same_specials = TikTokenBaseTokenizer(
        changed, "tiny", LLAMA3_PATTERN, len(ranks), len(ranks) + 1, tiktoken_tokenizer.special_tokens
    )
    assert tokenizer_identity(other) != tokenizer_identity(fresh)
    assert tokenizer_identity(other_same_specials) != tokenizer_identity(fresh)


def test_tokenizer_json_pickles_as_its_text_with_a_stable_identity(hf, tmp_path):
    # pickled (and hashed for the datasets cache key) as the tokenizer.json text, its working copies rebuilt
    import pickle

    from tune.datasets._hf import tokenizer_identity

    clone = pickle.loads(pickle.dumps(hf))
    segments = [Segment("<|im_start|>", False, special=True), Segment("user\nHi <|im_end|> x", True)]
    assert clone.encode(TEXT) == hf.encode(TEXT) and clone.decode(hf.encode(TEXT)) == hf.decode(hf.encode(TEXT))
    assert clone.encode_segments(segments) == hf.encode_segments(segments)
    assert clone.token_id("<|im_end|>") == hf.token_id("<|im_end|>") and clone.vocab_size == hf.vocab_size
    assert tokenizer_identity(clone) == tokenizer_identity(hf)
    fresh = HuggingFaceBaseTokenizer(qwen_tokenizer_json())
    unused = tokenizer_identity(fresh)
    fresh.encode_segments_batch([segments] * 40)  # builds its encoding engine: a cache, not part of the identity
    assert tokenizer_identity(fresh) == unused == tokenizer_identity(hf)
    data = json.loads((qwen_tokenizer_json() / "tokenizer.json").read_text())
    data["normalizer"] = None  # tokens can differ: so must the identity
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_identity(HuggingFaceBaseTokenizer(tmp_path)) != tokenizer_identity(hf)


def test_flags_from_lengths_of_many_texts_at_once_equal_each_text_alone():
    # the batch form places all texts end to end: a text's flags must not leak into its neighbours, including
    # texts without runs, texts whose tokens stop short of their end, and empty tokens at text boundaries
    import numpy as np

    rng = random.Random(3)
    for _ in range(300):
        lengths, counts, runs, expected = [], [], [], []
        for _ in range(rng.randint(1, 8)):
            text_runs, end = [], 0
            for _ in range(rng.randint(0, 4)):
                end += rng.randint(0 if text_runs and rng.random() < 0.2 else 1, 7)  # empty runs inside a text
                text_runs.append((end, rng.random() < 0.5))
            target, text_lengths = max(end - rng.choice([0, 0, 0, 1, 2]), 0), []
            while sum(text_lengths) < target:
                text_lengths.append(min(rng.choice([0, 1, 1, 2, 3, 5]), target - sum(text_lengths)))
            if not text_lengths or rng.random() < 0.2:
                text_lengths.append(0)
            flags, start = bytearray(), 0
            for run_end, trained in text_runs:
                flags.extend([trained] * (run_end - start))
                start = run_end
            offsets = [(sum(text_lengths[:i]), sum(text_lengths[: i + 1])) for i in range(len(text_lengths))]
            expected += token_flags(offsets, flags) if text_runs else [False] * len(text_lengths)
            lengths += text_lengths
            counts.append(len(text_lengths))
            runs.append(text_runs)
        got = flags_from_lengths_batch(np.array(lengths, dtype=np.int64), np.array(counts), runs)
        assert got.tolist() == expected, (lengths, counts, runs)


@pytest.mark.parametrize("dummy_prefix,gemma", [(True, False), (False, False), (False, True)])
def test_sentencepiece_masks_from_token_lengths_equal_masks_from_offsets(dummy_prefix, gemma):
    # SentencePiece models that encode by words (Llama 2's with a dummy prefix, Gemma's without) compute the flags
    # of mixed texts from each piece's byte length; the result must equal the flags from SentencePiece's own
    # offsets (token_flags), text by text
    from tests.tune.data._tiny_tokenizers import corpus

    sp = SentencePieceBaseTokenizer(sentencepiece_model(dummy_prefix=dummy_prefix, gemma=gemma) / "tokenizer.model")
    assert sp._piece_byte_lengths() is not None
    bos, eos = sp._sp.id_to_piece(sp.bos_id), sp._sp.id_to_piece(sp.eos_id)
    rng = random.Random(1)
    lines = list(corpus())
    conversations = []
    for _ in range(300):  # several texts per conversation, split at random characters, flags at random
        segments = [Segment(bos, False, special=True)] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            text = rng.choice(lines) + rng.choice(["", " ", "\n", "  x", " é", "\u2581y"])
            cuts = sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1)))
            for a, b in zip([0, *cuts], [*cuts, len(text)]):
                segments.append(Segment(text[a:b], rng.random() < 0.5))
            segments.append(Segment(eos, rng.random() < 0.5, special=True))
        conversations.append(segments)
    fast = sp.encode_segments_batch(conversations)
    by_offsets = encode_chunked_batch(
        conversations,
        sp.token_id,
        sp._encode_whole,
        sp._encode_with_offsets_batch,
        prepare_separate=sp._prepare_separate,
    )
    assert fast == by_offsets


def _family_tokenizers():
    from tests.tune.data._tiny_tokenizers import phi3_tokenizer_dir
    from tune.models.gemma2._tokenizer import gemma2_tokenizer
    from tune.models.llama2._tokenizer import llama2_tokenizer
    from tune.models.llama3._tokenizer import llama3_tokenizer
    from tune.models.mistral._tokenizer import mistral_tokenizer
    from tune.models.phi3._tokenizer import phi3_mini_tokenizer
    from tune.models.qwen2_5._tokenizer import qwen2_5_tokenizer
    from tune.models.qwen3._tokenizer import qwen3_tokenizer

    sp = str(sentencepiece_model() / "tokenizer.model")
    return {
        "llama2": lambda: llama2_tokenizer(sp),
        "llama3": lambda: llama3_tokenizer(str(tiktoken_file())),
        "mistral": lambda: mistral_tokenizer(sp, prompt_template="tune.data.MistralChatFormat"),
        "qwen2_5": lambda: qwen2_5_tokenizer(str(qwen_tokenizer_json())),
        "qwen3": lambda: qwen3_tokenizer(str(qwen_tokenizer_json(qwen3=True))),
        "gemma2": lambda: gemma2_tokenizer(str(sentencepiece_model(False, True) / "tokenizer.model")),
        "phi3": lambda: phi3_mini_tokenizer(str(phi3_tokenizer_dir() / "tokenizer.json")),
    }


@pytest.mark.parametrize("family", ["llama2", "llama3", "mistral", "qwen2_5", "qwen3", "gemma2", "phi3"])
def test_family_tokenizers_follow_the_protocol_and_pickle(family):
    import pickle

    from tests.tune.data._tiny_tokenizers import conversation
    from tune.data import ModelTokenizer, mask_messages
    from tune.datasets._hf import tokenizer_identity

    tok = _family_tokenizers()[family]()
    assert isinstance(tok, ModelTokenizer)
    assert tok.eos_id in tok.stop_tokens
    identity = tokenizer_identity(tok)
    messages = mask_messages(conversation(system=family != "gemma2"))
    tokens, mask = tok.tokenize_messages(messages)
    assert len(tokens) == len(mask) and not all(mask) and any(mask)
    batch = [messages] * 70  # past the batch sizes where word caches and engines start
    assert tok.tokenize_messages_batch(batch) == [(tokens, mask)] * 70
    # datasets.map(num_proc=N) ships the tokenizer to worker processes
    assert pickle.loads(pickle.dumps(tok)).tokenize_messages(messages) == (tokens, mask)
    # the caches filled above (word caches, short texts, the tiktoken engine) are no part of the datasets cache key
    assert tokenizer_identity(tok) == identity


def test_llama3_special_tokens_path(tmp_path):
    from tune.models.llama3._tokenizer import llama3_special_tokens, llama3_tokenizer

    num_base = len(load_tiktoken_ranks(tiktoken_file()))
    special = llama3_special_tokens(num_base)
    special["<|my_renamed_token|>"] = special.pop("<|reserved_special_token_5|>")
    added = [{"id": i, "content": c, "special": True} for c, i in special.items()]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))
    tok = llama3_tokenizer(str(tiktoken_file()), special_tokens_path=str(tmp_path / "tokenizer.json"))
    assert tok.special_tokens["<|my_renamed_token|>"] == num_base + 13
    with pytest.raises(FileNotFoundError, match="special_tokens_path"):
        llama3_tokenizer(str(tiktoken_file()), special_tokens_path=str(tmp_path / "absent.json"))


@pytest.mark.parametrize(
    "family", ["llama2", "llama2_no_template", "llama3", "mistral", "mistral_no_template", "qwen2_5", "gemma2", "phi3"]
)
def test_batch_equals_one_at_a_time(family):
    # tokenize_messages_batch encodes every text of every conversation in one backend call (above 64 texts, in
    # the backend's thread pool); the result must be exactly that of each conversation alone
    from tests.tune.data._tiny_tokenizers import random_conversations
    from tune.data import mask_messages
    from tune.models.llama2._tokenizer import llama2_tokenizer
    from tune.models.mistral._tokenizer import mistral_tokenizer

    sp = str(sentencepiece_model() / "tokenizer.model")
    builders = {
        **_family_tokenizers(),
        "llama2_no_template": lambda: llama2_tokenizer(sp, prompt_template=None),
        "mistral_no_template": lambda: mistral_tokenizer(sp, prompt_template=None),
    }
    tok = builders[family]()
    strategies = ["train_on_assistant", "train_on_all", "train_on_last"]
    conversations = [
        mask_messages(messages, strategies[i % 3])
        for i, messages in enumerate(random_conversations(count=80, seed=7, system=family != "gemma2"))
    ]
    for add_end_tokens in [True, False]:
        batch = tok.tokenize_messages_batch(conversations, add_end_tokens=add_end_tokens)
        single = [tok.tokenize_messages(messages, add_end_tokens=add_end_tokens) for messages in conversations]
        assert batch == single
    assert any(not all(mask) and any(mask) for _, mask in batch)  # the masks are not trivial


def test_tokenizer_json_rejects_separately_encoded_text(hf):
    from tune.data import Segment

    with pytest.raises(ValueError, match="cannot encode messages separately"):
        hf.encode_segments([Segment("text", True, separate=True)])


def test_sentencepiece_pickle_is_the_same_in_every_process():
    # the datasets cache key hashes the pickled tokenizer: rstrip tokens (a frozenset, pickled in hash order) made
    # Phi-3's key differ from process to process, so a rerun never found its tokenised cache
    import subprocess
    import sys

    path = sentencepiece_model() / "tokenizer.model"
    code = (
        "import hashlib, pickle, sys; from tune.data import SentencePieceBaseTokenizer; "
        "tok = SentencePieceBaseTokenizer(sys.argv[1], {'<|a|>': 600, '<|b|>': 601, '<|c|>': 602}, "
        "rstrip_tokens=['<|a|>', '<|b|>', '<|c|>']); print(hashlib.sha256(pickle.dumps(tok)).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout  # fmt: skip
        for seed in range(4)
    }
    assert len(digests) == 1
