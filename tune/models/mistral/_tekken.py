"""Mistral's ``tokenizer.json`` tokenizers with control tokens (Mistral NeMo's "tekken", a tiktoken-style
byte-level BPE) and the ``[INST]...[/INST]`` chat format of ``mistralai/Mistral-Nemo-Instruct-2407``."""

from collections.abc import Sequence

from tune.data import Message
from tune.data._chat_formats import Segment, _Builder, _open_end, _split_system
from tune.data._tokenizers import ChatTokenizer, HuggingFaceBaseTokenizer, PromptTemplate

# the control tokens the chat format writes (ids 1-4 in the tekken vocabulary); their strings inside message
# content become the same control tokens, as in transformers' apply_chat_template
_CONTROL_TOKENS = ("<s>", "</s>", "[INST]", "[/INST]")


class MistralNemoChatFormat:
    """Mistral NeMo instruct: ``<s>[INST]{user}[/INST]{assistant}</s>[INST]...``, with ``[INST]``, ``[/INST]``,
    ``<s>`` and ``</s>`` control tokens and no spaces around them.

    Reproduces the chat template of ``mistralai/Mistral-Nemo-Instruct-2407`` (content is not stripped; there is no
    generation prompt: the answer follows ``[/INST]``). A system prompt goes before the last user turn's text,
    followed by a blank line, as Mistral's own formatting (``mistral_common``) places it. The Hugging Face template
    does so only when that user turn ends the conversation (a prompt for generation); on a conversation that ends
    with an answer it drops the system prompt, which for training would silently lose it, so tune keeps it there.
    """

    name = "mistral_nemo"
    roles = frozenset({"system", "user", "assistant"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        return render_control_inst(messages, self.name, add_end_tokens=add_end_tokens, strip_answers=False)


def render_control_inst(
    messages: Sequence[Message], fmt_name: str, *, add_end_tokens: bool, strip_answers: bool
) -> list[Segment]:
    """The segments of Mistral's control-token layouts (NeMo's, and v0.3's): ``<s>``, then ``[INST]`` user
    ``[/INST]`` for a user turn, the system prompt and a blank line before the last user turn's text, and an
    answer followed by ``</s>`` (stripped of surrounding whitespace with ``strip_answers``).

    Args:
        messages (Sequence[Message]): the checked conversation.
        fmt_name (str): the chat format's name, for error messages.
        add_end_tokens (bool): False leaves a final answer open (no ``</s>``).
        strip_answers (bool): strip each answer's text, as the v0.3 template's ``trim`` does.

    Returns:
        list[Segment]: the rendered conversation.
    """
    b = _Builder(messages)
    system, rest = _split_system(messages, fmt_name)
    last_user = max((i for i, m in rest if m.role == "user"), default=None)
    b.fixed("<s>", special=True)
    for i, m in rest:
        if m.role == "user":
            b.header(i, "[INST]", special=True)
            if i == last_user and system is not None:
                b.content(0, system._text)
                b.end(0, "\n\n")
            b.content(i, m._text)
            b.end(i, "[/INST]", special=True)
        else:
            b.content(i, m._text.strip() if strip_answers else m._text)
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "</s>", special=True)
    return b.segments


def mistral_nemo_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
) -> ChatTokenizer:
    """The Mistral NeMo tokenizer: ``tokenizer.json`` (tekken, a byte-level BPE whose first ids are control
    tokens) with the chat format of ``mistralai/Mistral-Nemo-Instruct-2407`` (see :class:`MistralNemoChatFormat`).

    A conversation is encoded as one text, as ``transformers`` encodes the rendered template.

    Args:
        path (str): ``tokenizer.json`` or its directory (``tokenizer_config.json`` beside it is read for the
            special tokens when present).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        ChatTokenizer: BOS ``<s>``, EOS ``</s>``, pad ``<pad>`` (EOS where the vocabulary has none), stop tokens
        ``[</s>]``.

    Raises:
        FileNotFoundError: if no ``tokenizer.json`` is found at ``path``.
        ValueError: if the vocabulary lacks one of ``<s>``, ``</s>``, ``[INST]``, ``[/INST]`` (the tokenizer of
            another model: Mistral 7B v0.1/v0.2 ship ``tokenizer.model``, read by ``mistral_tokenizer``).
    """
    text = HuggingFaceBaseTokenizer(path)
    ids = {}
    for token in _CONTROL_TOKENS:
        try:
            ids[token] = text.token_id(token)
        except ValueError as error:
            raise ValueError(
                f"{path!r} has no {token!r} token, so it is not a Mistral NeMo (tekken) or v0.3 tokenizer.json; "
                "for a tokenizer.model of Mistral 7B use tune.models.mistral.mistral_tokenizer."
            ) from error
    eos_id = ids["</s>"]
    pad_id = text.pad_id
    if pad_id is None:
        try:
            pad_id = text.token_id("<pad>")
        except ValueError:
            pad_id = eos_id
    return ChatTokenizer(
        text,
        MistralNemoChatFormat(),
        bos_id=ids["<s>"],
        eos_id=eos_id,
        pad_id=pad_id,
        stop_tokens=[eos_id],
        special_tokens=ids,
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
    )
