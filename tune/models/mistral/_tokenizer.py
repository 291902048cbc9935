"""Mistral tokenizer: SentencePiece ``tokenizer.model`` with the Mistral ``[INST]`` chat format (as text for the
v0.1/v0.2 vocabulary, as control tokens for v0.3's)."""

from collections.abc import Sequence

from tune.data import Message
from tune.data._chat_formats import MistralChatFormat, PlainChatFormat, Segment
from tune.data._prompt_templates import MistralChatTemplate
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format
from tune.models.mistral._tekken import render_control_inst

# tune's name for the Hugging Face-exact Mistral chat formats, as ``prompt_template`` (torchtune's
# MistralChatTemplate, the default, keeps torchtune's tokens instead).
MISTRAL_CHAT_FORMAT = "tune.data.MistralChatFormat"


def _chat_format_name(prompt_template: object) -> object:
    """:class:`~tune.data.MistralChatFormat` given as the class or an instance, by its dotted name; torchtune's
    dotted name of the template, the template (other values unchanged)."""
    if prompt_template is MistralChatFormat or isinstance(prompt_template, MistralChatFormat):
        return MISTRAL_CHAT_FORMAT
    if prompt_template == "torchtune.models.mistral.MistralChatTemplate":  # a config's spelling before `tune migrate`
        return MistralChatTemplate()
    return prompt_template


class MistralV3ChatFormat:
    """Mistral 7B v0.3 instruct: ``<s>[INST] {user}[/INST] {assistant}</s>[INST] ...``, with ``[INST]``,
    ``[/INST]``, ``<s>`` and ``</s>`` control tokens.

    Reproduces the text-only part of the chat template of ``mistralai/Mistral-7B-Instruct-v0.3``: user text is not
    stripped, each answer is stripped and follows a space, and the system prompt goes before the last user turn's
    text, followed by a blank line. The template does the last only when that user turn ends the conversation; on
    a conversation that ends with an answer it drops the system prompt, which for training would silently lose
    it, so tune keeps it there, where Mistral's own formatting (``mistral_common``) puts it.

    The space the template writes after ``[INST]`` and after ``[/INST]`` is not a segment of its own: each text
    between two control tokens is encoded on its own and gets SentencePiece's dummy prefix ``"▁"``, which is that
    space (the Hugging Face tokenizer turns the template's leading space into the same ``"▁"`` and adds none of its
    own), so the tokens are the template's. For that reason this format is only for a SentencePiece model with a
    dummy prefix, the v0.3 ``tokenizer.model``. Control-token strings inside message text stay text, as
    ``mistral_common`` encodes content (transformers' template would turn them into control tokens).
    """

    name = "mistral_v0_3"
    roles = frozenset({"system", "user", "assistant"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        return render_control_inst(messages, self.name, add_end_tokens=add_end_tokens, strip_answers=True)


def _control_id(sp: SentencePieceBaseTokenizer, token: str) -> int | None:
    """The id of ``token`` when the model has it as a control piece (a piece that decodes to no text), else None."""
    try:
        token_id = sp.token_id(token)
    except ValueError:
        return None
    return token_id if sp.decode([token_id]) == "" else None


def _inst_control_ids(sp: SentencePieceBaseTokenizer, path: str) -> dict[str, int]:
    """``{"[INST]": id, "[/INST]": id}`` for a v0.3 vocabulary (both control pieces), ``{}`` for v0.1/v0.2."""
    ids = {token: _control_id(sp, token) for token in ("[INST]", "[/INST]")}
    found = {token: i for token, i in ids.items() if i is not None}
    if len(found) == 1:
        (have,) = found
        (lack,) = set(ids) - set(found)
        raise ValueError(
            f"{path!r} has {have!r} as a control token but not {lack!r}, so it is neither a Mistral 7B v0.1/v0.2 "
            "tokenizer.model (both as text) nor a v0.3 one (both control tokens); pass the tokenizer.model shipped "
            "with the model."
        )
    return found


class MistralTokenizer(ChatTokenizer):
    """The Mistral 7B tokenizer (torchtune's class; :func:`mistral_tokenizer` returns one).

    The chat format follows the vocabulary: the 32000-piece v0.1/v0.2 ``tokenizer.model`` spells ``[INST]`` and
    ``[/INST]`` as text (:class:`~tune.data.MistralChatFormat`); the 32768-piece v0.3 one has them as control
    pieces (ids 3 and 4, then ``[TOOL_CALLS]``, ``[AVAILABLE_TOOLS]``, ... and ``[control_N]``), which the v0.3 chat
    format writes as single tokens (:class:`MistralV3ChatFormat`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune, a template (a callable, or its dotted path;
            the default is torchtune's :class:`MistralChatTemplate`) is applied to the messages, which are then
            laid out without a chat format (:class:`~tune.data.PlainChatFormat`: BOS, each text part, EOS after
            each answer), giving torchtune's tokens; None lays them out with no template. tune's
            :class:`~tune.data.MistralChatFormat` (the class, an instance or ``"tune.data.MistralChatFormat"``)
            selects instead the chat format of ``mistralai/Mistral-7B-Instruct-v0.2`` (a system prompt folded
            into the first user turn), or with a v0.3 vocabulary that of ``mistralai/Mistral-7B-Instruct-v0.3``,
            token for token, which tune's own configs use.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if only one of ``[INST]`` and ``[/INST]`` is a control piece of the model.
    """

    def __init__(
        self,
        path: str,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = MistralChatTemplate(),  # noqa: B008 (stateless)
    ) -> None:
        sp = SentencePieceBaseTokenizer(path)
        inst_ids = _inst_control_ids(sp, str(path))
        chat_format, template = select_chat_format(
            _chat_format_name(prompt_template),
            {MISTRAL_CHAT_FORMAT},
            MistralV3ChatFormat() if inst_ids else MistralChatFormat("<s>", "</s>"),
            PlainChatFormat("<s>", "</s>"),
        )
        super().__init__(
            sp,
            chat_format,
            bos_id=sp.bos_id,
            eos_id=sp.eos_id,
            pad_id=sp.pad_id,
            stop_tokens=[sp.eos_id],
            special_tokens={"<s>": sp.bos_id, "</s>": sp.eos_id, **inst_ids},
            max_seq_len=max_seq_len,
            prompt_template=template,
        )


def mistral_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = "tune.models.mistral.MistralChatTemplate",
) -> MistralTokenizer:
    """The Mistral 7B tokenizer, by default with torchtune's ``MistralChatTemplate`` (torchtune's tokens). With
    ``prompt_template="tune.data.MistralChatFormat"``: the ``[INST]`` chat format of
    ``mistralai/Mixtral-8x7B-Instruct-v0.1`` (the same template as ``Mistral-7B-Instruct-v0.2``; a system prompt is
    folded into the first user turn), or, for the v0.3 ``tokenizer.model`` (``[INST]``/``[/INST]`` control
    pieces), that of ``mistralai/Mistral-7B-Instruct-v0.3`` with ``[INST]``/``[/INST]`` as single tokens (see
    :class:`MistralV3ChatFormat`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune; see :class:`MistralTokenizer`.

    Returns:
        MistralTokenizer: BOS ``<s>``, EOS ``</s>``, pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if only one of ``[INST]`` and ``[/INST]`` is a control piece of the model.
    """
    return MistralTokenizer(path, max_seq_len, prompt_template)
