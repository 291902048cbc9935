"""Tiny tokenizers built in code for the tokenizer and chat-format tests (no downloads, no shipped assets).

Each builder trains on the same generated corpus and writes its files once per test session (lru_cache) into a
temporary directory:

- ``sentencepiece_model(dummy_prefix=...)``: a BPE SentencePiece model set up like Llama 2's (byte fallback,
  identity normalisation, no whitespace collapsing, digits split; dummy prefix on) or Gemma's (dummy prefix off,
  ``<start_of_turn>``/``<end_of_turn>`` as user-defined pieces).
- ``tiktoken_file()``: a tiktoken BPE file (base64 token + rank), first the 256 single bytes, then the merges of a
  byte-level BPE trained with ``tokenizers``.
- ``qwen_tokenizer_json(...)``: a byte-level BPE ``tokenizer.json`` with Qwen's normaliser, regex and added tokens.
- ``phi3_tokenizer_dir()``: the Llama-style model with Phi-3's added tokens (``tokenizer.model`` + ``tokenizer.json``).
- ``phi4_bpe_files()``: a byte-level BPE with Phi-4's regex as ``vocab.json`` + ``merges.txt``, and a
  ``tokenizer.json`` holding Phi-4's special tokens.
"""

import atexit
import base64
import functools
import json
import random
import shutil
import tempfile
from pathlib import Path

from tune.data import Message
from tune.data._tokenizers._byte_level import _byte_decoder  # GPT-2's byte <-> character map, inverted

_WORDS = (
    "the quick brown fox jumps over a lazy dog hello world what is why how when where who you are helpful "
    "assistant answer question please explain tune model train data loss token mask chat system prompt café "
    "naïve über résumé paris france capital city river bank number one two three four five"
).split()
_PUNCT = [".", ",", "?", "!", ":", ";", "'s", "'re", " -", " (x)", " [1]", ' "q"', " 42", " 2024", " 3.14"]


@functools.cache
def corpus() -> tuple[str, ...]:
    """About 3000 deterministic lines of words, punctuation, digits, accents and the chat templates' markers."""
    rng = random.Random(0)
    markers = ["[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "user", "model", "assistant", "system", "<think>"]
    lines = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(markers))
        text = " ".join(words) + rng.choice(_PUNCT)
        if rng.random() < 0.2:
            text += "\n" + rng.choice(_WORDS)
        lines.append(text)
    return tuple(lines)


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="tune-tiny-tokenizers-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Mistral 7B v0.3's control pieces after <unk> <s> </s> (ids 3-9 of its tokenizer.model), then the first two of its
# [control_N] placeholders (N = id - 2), which fill the vocabulary's control ids up to 770
MISTRAL_V0_3_CONTROL_PIECES = (
    "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[control_8]", "[control_9]",
)  # fmt: skip


def sentencepiece_model(dummy_prefix: bool = True, gemma: bool = False, mistral_v0_3: bool = False) -> Path:
    """Trains a tiny BPE SentencePiece model (once per setting); returns the directory holding ``tokenizer.model``.
    ``mistral_v0_3`` adds Mistral 7B v0.3's control pieces (:data:`MISTRAL_V0_3_CONTROL_PIECES`) at ids 3-11."""
    return _sentencepiece_model(bool(dummy_prefix), bool(gemma), bool(mistral_v0_3))


def gemma_sentencepiece_model() -> Path:
    """Gemma's kind of SentencePiece model (no dummy prefix, ``<start_of_turn>``/``<end_of_turn>`` as pieces,
    pad 0 / eos 1 / bos 2); returns the directory holding ``tokenizer.model``."""
    return sentencepiece_model(dummy_prefix=False, gemma=True)


@functools.cache
def _sentencepiece_model(dummy_prefix: bool, gemma: bool, mistral_v0_3: bool = False) -> Path:
    import sentencepiece as spm

    out = _workdir() / f"sp-{int(dummy_prefix)}-{int(gemma)}{'-mistral-v0.3' if mistral_v0_3 else ''}"
    out.mkdir()
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    names = dict(bos_piece="<bos>", eos_piece="<eos>", pad_piece="<pad>") if gemma else {}
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_prefix=str(out / "tokenizer"),
        vocab_size=480,
        model_type="bpe",
        byte_fallback=True,
        add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        split_digits=True,
        character_coverage=1.0,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"] if gemma else [],
        control_symbols=list(MISTRAL_V0_3_CONTROL_PIECES) if mistral_v0_3 else [],
        minloglevel=2,
        num_threads=1,
        **ids,
        **names,
    )
    return out


def _train_byte_level_bpe(pattern: str, vocab_size: int, nfc: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


@functools.cache
def tiktoken_file() -> Path:
    """A tiktoken BPE file (Llama 3 ``tokenizer.model`` format) with 256 byte ranks and ~350 merges."""
    from tune.models.llama3._tokenizer import LLAMA3_PATTERN

    tokenizer = _train_byte_level_bpe(LLAMA3_PATTERN, vocab_size=600, nfc=False)
    model_dir = _workdir() / "bpe-llama3"
    model_dir.mkdir()
    tokenizer.model.save(str(model_dir))
    decode = _byte_decoder()
    ranks = {bytes([b]): b for b in range(256)}
    for line in (model_dir / "merges.txt").read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#version"):
            continue
        left, right = line.split(" ")
        token = bytes(decode[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    path = _workdir() / "llama3-tokenizer.model"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return path


def qwen_tokenizer_json(qwen3: bool = False) -> Path:
    """A Qwen-style ``tokenizer.json`` (NFC, Qwen regex, byte-level BPE, Qwen's added tokens) in its own
    directory, next to ``vocab.json``/``merges.txt`` of the same model."""
    return _qwen_tokenizer_json(bool(qwen3))


@functools.cache
def _qwen_tokenizer_json(qwen3: bool) -> Path:
    from tokenizers import AddedToken

    from tune.models.qwen2_5._tokenizer import QWEN2_5_ADDED_TOKENS, QWEN2_PATTERN
    from tune.models.qwen3._tokenizer import QWEN3_ADDED_TOKENS

    tokenizer = _train_byte_level_bpe(QWEN2_PATTERN, vocab_size=600, nfc=True)
    out = _workdir() / f"qwen-{int(qwen3)}"
    out.mkdir()
    tokenizer.model.save(str(out))
    for content, special in QWEN3_ADDED_TOKENS if qwen3 else QWEN2_5_ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return out


def conversation(system: bool = True) -> list[Message]:
    """A multi-turn conversation whose content exercises whitespace, punctuation, digits and accents."""
    messages = [Message("system", "You are a helpful assistant. Answer in one line.")] if system else []
    messages += [
        Message("user", "What is the capital of France?"),
        Message("assistant", "The capital of France is Paris (a city on a river)."),
        Message("user", "Why? Please explain, café 42 times\nthen stop. "),
        Message("assistant", "2024: the quick brown fox!\n\nOne two three."),
    ]
    return messages


def as_dicts(messages: list[Message]) -> list[dict]:
    """Messages in the form ``apply_chat_template`` takes."""
    return [{"role": m.role, "content": m.text_content} for m in messages]


def trained_runs(tokens: list[int], mask: list[bool]) -> list[list[int]]:
    """The maximal runs of trained (unmasked) tokens."""
    runs, current = [], []
    for token, masked in zip(tokens, mask):
        if masked:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(token)
    if current:
        runs.append(current)
    return runs


def hf_ids(hf_tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """``apply_chat_template(..., tokenize=True)`` as a list of ids (transformers 4 returns a list, 5 a dict)."""
    out = hf_tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def legacy_sentencepiece_reference(directory: Path, chat_template: str, **kwargs):
    """A transformers tokenizer for a Llama-style SentencePiece model, with the pipeline of the tokenizer.json
    files shipped with Llama 2 and Mistral 7B v0.1/v0.2/Mixtral: a ``Prepend("▁")`` + ``Replace(" ", "▁")``
    normalizer and no pre-tokenizer, so every piece of text between special tokens gets the dummy prefix exactly
    as sentencepiece gives it (" [INST]" after ``<s>`` is "▁" + "▁[", ids 28705, 733 with Mistral's vocabulary).

    transformers 5's ``LlamaTokenizer`` class rebuilds the pipeline with a Metaspace pre-tokenizer instead, which
    skips the prefix when the text already starts with a space; that differs from sentencepiece, so the converted
    vocabulary and merges are kept and the original pipeline is put back.
    """
    import transformers
    from tokenizers import normalizers

    converted = transformers.LlamaTokenizer.from_pretrained(str(directory), legacy=True).backend_tokenizer
    converted.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    converted.pre_tokenizer = None
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=converted,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=chat_template,
        **kwargs,
    )


@functools.cache
def phi3_tokenizer_dir() -> Path:
    """A Phi-3-style directory: the Llama-style ``tokenizer.model``, and a ``tokenizer.json`` of the same model
    with Phi-3's 11 added tokens after the vocabulary (``rstrip`` as microsoft/Phi-3-mini-4k-instruct sets it),
    plus a ``tokenizer_config.json`` naming ``<s>`` / ``<|endoftext|>``."""
    from tokenizers import AddedToken

    from tune.models.phi3._tokenizer import PHI3_ADDED_TOKENS

    out = _workdir() / "phi3"
    out.mkdir()
    shutil.copy(sentencepiece_model() / "tokenizer.model", out / "tokenizer.model")
    backend = legacy_sentencepiece_reference(out, chat_template="").backend_tokenizer
    for content, rstrip in PHI3_ADDED_TOKENS:
        backend.add_special_tokens([AddedToken(content, rstrip=rstrip, normalized=False, special=True)])
    backend.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def random_conversations(count: int = 25, seed: int = 0, system: bool = True) -> list[list[Message]]:
    """Seeded random conversations (1-3 exchanges) whose content has leading/trailing/inner whitespace runs,
    newlines, tabs, digits, punctuation, accents and an emoji: the cases where templates and tokenizers disagree
    when a chat format is reproduced carelessly."""
    rng = random.Random(seed)
    pieces = _WORDS + ["42", "3.14", "!", "?", "...", "'s", "(x)", "😀", "naïve"]
    gaps = [" ", " ", " ", "  ", "\n", "\n\n", " \n", "\t", ", "]

    def text() -> str:
        body = rng.choice(pieces)
        for _ in range(rng.randint(0, 10)):
            body += rng.choice(gaps) + rng.choice(pieces)
        return rng.choice(["", "", " ", "\n", "  "]) + body + rng.choice(["", "", " ", "\n", ".\n"])

    conversations = []
    for _ in range(count):
        messages = [Message("system", text())] if system else []
        for _ in range(rng.randint(1, 3)):
            messages += [Message("user", text()), Message("assistant", text())]
        conversations.append(messages)
    return conversations


def torchtune_no_template_reference(model_path: "str | Path", messages: list[Message]) -> tuple[list[int], list[bool]]:
    """Tokens and mask of torchtune 0.6.1's SentencePiece tokenizers (llama2, mistral) built with
    ``prompt_template=None``, re-derived here from ``sentencepiece`` alone, following torchtune's documented rule
    (``tokenize_messages_no_special_tokens`` and ``SentencePieceBaseTokenizer.encode``):

    - BOS opens a turn (the first message, and the message after each assistant message); EOS follows each
      assistant message; BOS and EOS carry the mask of the message they belong to, as every token does;
    - each text part of each message is encoded on its own, trailing spaces removed;
    - a message that continues a turn, when the previous message did not end in a space and the vocabulary encodes
      whitespace, is encoded as "\\n" + text with the tokens of "\\n" then dropped (no dummy-prefix space).
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    newline = sp.encode("\n")
    encodes_whitespace = any(sp.encode(c) for c in [" ", "\n", "\t", "\r", "\v"])
    tokens: list[int] = []
    mask: list[bool] = []
    new_turn, previous_space = True, False
    for message in messages:
        if new_turn:
            tokens.append(sp.bos_id())
            mask.append(message.masked)
        texts = [part["content"].rstrip(" ") for part in message.content if part["type"] == "text"]
        for text in texts:
            if not new_turn and not previous_space and encodes_whitespace:
                ids = sp.encode("\n" + text)[len(newline) :]
            else:
                ids = sp.encode(text)
            tokens += ids
            mask += [message.masked] * len(ids)
        previous_space = message.content[-1]["content"].endswith(" ")
        new_turn = message.role == "assistant"
        if new_turn:
            tokens.append(sp.eos_id())
            mask.append(message.masked)
    return tokens, mask


@functools.cache
def phi4_bpe_files() -> Path:
    """A Phi-4-style byte-level BPE (cl100k regex, no normaliser) as ``vocab.json`` + ``merges.txt`` (torchtune's
    arguments), next to a ``tokenizer.json`` of the same model whose added tokens are Phi-4's 96 special tokens
    numbered after the BPE entries (what ``special_tokens_path`` reads)."""
    from tokenizers import AddedToken

    from tune.models.phi4._tokenizer import PHI4_ADDED_TOKENS, PHI4_PATTERN

    tokenizer = _train_byte_level_bpe(PHI4_PATTERN, vocab_size=600, nfc=False)
    out = _workdir() / "phi4-bpe"
    out.mkdir()
    tokenizer.model.save(str(out))
    tokenizer.add_special_tokens(
        [AddedToken(content, special=True, normalized=False) for content, _ in PHI4_ADDED_TOKENS]
    )
    tokenizer.save(str(out / "tokenizer.json"))
    return out
