"""Mistral 7B v0.3 and Mistral NeMo 12B: ``mistral_nemo_tokenizer`` (tekken ``tokenizer.json``) against
transformers' ``apply_chat_template`` on Mistral-Nemo-Instruct-2407's template, and ``mistral_tokenizer`` on a
v0.3-style ``tokenizer.model`` (``[INST]``/``[/INST]`` control pieces) against it on Mistral-7B-Instruct-v0.3's
template, token for token, with exact loss masks. NeMo's ``head_dim`` is checked against transformers' logits with
every family's cases (``_hf_cases.mistral_nemo_config``), the sizes against the published ``config.json`` values in
tests/tune/models/test_model_builders.py."""

import json

import pytest

from tests.recipes._family_assets import TEKKEN_CONTROL_TOKENS, tekken_tokenizer_dir
from tests.tune.data._tiny_tokenizers import (
    MISTRAL_V0_3_CONTROL_PIECES,
    as_dicts,
    conversation,
    hf_ids,
    legacy_sentencepiece_reference,
    random_conversations,
    sentencepiece_model,
    torchtune_no_template_reference,
    trained_runs,
)
from tests.tune.models._chat_templates import MISTRAL_TEMPLATE
from tune.data import Message, MistralChatFormat, PlainChatFormat, mask_messages
from tune.models.mistral import MistralV3ChatFormat, mistral_nemo_tokenizer, mistral_tokenizer

transformers = pytest.importorskip("transformers")

# The chat template of mistralai/Mistral-Nemo-Instruct-2407 (tokenizer_config.json): its system, user and
# assistant branches, verbatim (two long lines continued with a backslash), with the tool-calling branches left
# out (tune's format has no tool role).
NEMO_TEMPLATE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate \
user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial \
optional system message!") }}
    {%- endif %}
{%- endfor %}
"""


@pytest.fixture(scope="module")
def ours():
    return mistral_nemo_tokenizer(str(tekken_tokenizer_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tekken_tokenizer_dir() / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=NEMO_TEMPLATE,
    )


def _answers(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


def test_control_token_ids(ours):
    # tekken's layout: the control tokens are the first ids (<unk> 0, <s> 1, </s> 2, [INST] 3, [/INST] 4, <pad> 10)
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, TEKKEN_CONTROL_TOKENS.index("<pad>"))
    assert ours.special_tokens == {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4}
    assert ours.stop_tokens == [2]


def test_chat_parity_on_random_conversations_with_exact_masks(ours, reference):
    for messages in random_conversations(count=25, seed=5, system=False):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        assert _answers(ours, tokens, mask) == [m.text_content + "</s>" for m in messages if m.role == "assistant"]


def test_prompt_parity_with_a_system_message(ours, reference):
    # a prompt for generation (last message from the user): the template puts the system prompt in that turn
    for messages in random_conversations(count=10, seed=6, system=True):
        prompt = messages[:-1]
        tokens, _ = ours.tokenize_messages(prompt, add_end_tokens=False)
        assert tokens == hf_ids(reference, as_dicts(prompt), add_generation_prompt=True), as_dicts(prompt)


def test_training_conversation_keeps_its_system_prompt_in_the_last_user_turn(ours, reference):
    messages = mask_messages(conversation(system=True))
    tokens, mask = ours.tokenize_messages(messages)
    system, *rest = conversation(system=True)
    # the Hugging Face template drops the system prompt when an answer ends the conversation ...
    assert hf_ids(reference, as_dicts(rest)) == hf_ids(reference, as_dicts([system, *rest]))
    # ... tune keeps it where mistral_common puts it: before the last user turn's text
    last_user = max(i for i, m in enumerate(rest) if m.role == "user")
    moved = [*rest]
    moved[last_user] = Message("user", f"{system.text_content}\n\n{rest[last_user].text_content}")
    assert tokens == hf_ids(reference, as_dicts(moved))
    assert _answers(ours, tokens, mask) == [m.text_content + "</s>" for m in rest if m.role == "assistant"]


def test_control_token_strings_in_content_become_control_tokens_as_in_transformers(ours, reference):
    messages = [Message("user", "say [INST] and </s> please"), Message("assistant", "ok [/INST] done")]
    tokens, _ = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert tokens.count(3) == 2 and tokens.count(4) == 2 and tokens.count(2) == 2


def test_a_tokenizer_json_without_control_tokens_is_refused_naming_the_other_builder(tmp_path):
    source = json.loads((tekken_tokenizer_dir() / "tokenizer.json").read_text())
    source["added_tokens"] = [t for t in source["added_tokens"] if t["content"] != "[INST]"]
    del source["model"]["vocab"]["[INST]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(source))
    with pytest.raises(ValueError, match=r"no '\[INST\]' token.*mistral_tokenizer"):
        mistral_nemo_tokenizer(str(tmp_path))


# The chat template of mistralai/Mistral-7B-Instruct-v0.3 (tokenizer_config.json): its system, user and assistant
# branches, verbatim (two long lines continued with a backslash), with the tool-calling branches left out (tune's
# format has no tool role) and the role-alternation check, which skips tool messages there, on loop.index0.
V0_3_TEMPLATE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate \
user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial \
optional system message!") }}
    {%- endif %}
{%- endfor %}
"""


@pytest.fixture(scope="module")
def ours_v0_3():
    path = sentencepiece_model(mistral_v0_3=True) / "tokenizer.model"
    return mistral_tokenizer(str(path), prompt_template="tune.data.MistralChatFormat")


@pytest.fixture(scope="module")
def reference_v0_3():
    # transformers' own conversion of the tokenizer.model: the control pieces become special added tokens, and a
    # Metaspace pre-tokenizer turns the template's space after [INST] / [/INST] into the next piece's "▁"
    return transformers.LlamaTokenizer.from_pretrained(
        str(sentencepiece_model(mistral_v0_3=True)), chat_template=V0_3_TEMPLATE
    )


def test_v0_3_control_pieces_are_found_with_their_ids(ours_v0_3, reference_v0_3):
    assert isinstance(ours_v0_3.chat_format, MistralV3ChatFormat)
    assert ours_v0_3.special_tokens == {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4}
    assert reference_v0_3.convert_tokens_to_ids(list(MISTRAL_V0_3_CONTROL_PIECES)) == list(range(3, 12))
    assert (ours_v0_3.bos_id, ours_v0_3.eos_id, ours_v0_3.stop_tokens) == (1, 2, [2])


def test_v0_3_chat_parity_on_random_conversations_with_exact_masks(ours_v0_3, reference_v0_3):
    conversations = [mask_messages(m) for m in random_conversations(count=40, seed=7, system=False)]
    # the batch path (over 64 texts: SentencePiece's word cache, masks from token lengths) gives the same result
    batch = ours_v0_3.tokenize_messages_batch(conversations)
    for messages, batched in zip(conversations, batch, strict=True):
        tokens, mask = ours_v0_3.tokenize_messages(messages)
        assert (tokens, mask) == batched
        assert tokens == hf_ids(reference_v0_3, as_dicts(messages)), as_dicts(messages)
        assert tokens.count(3) == tokens.count(4) == sum(m.role == "user" for m in messages)
        # trained: each answer as the template writes it (stripped) and its </s>
        answers = [ours_v0_3.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert answers == [m.text_content.strip() + "</s>" for m in messages if m.role == "assistant"]


def test_v0_3_prompt_parity_with_a_system_message(ours_v0_3, reference_v0_3):
    # a prompt for generation (last message from the user): the template puts the system prompt in that turn
    for messages in random_conversations(count=10, seed=8, system=True):
        prompt = messages[:-1]
        tokens, _ = ours_v0_3.tokenize_messages(prompt, add_end_tokens=False)
        assert tokens == hf_ids(reference_v0_3, as_dicts(prompt), add_generation_prompt=True), as_dicts(prompt)


def test_v0_3_training_conversation_keeps_its_system_prompt_in_the_last_user_turn(ours_v0_3, reference_v0_3):
    for messages in [conversation(system=True), *random_conversations(count=5, seed=9, system=True)]:
        tokens, mask = ours_v0_3.tokenize_messages(mask_messages(messages))
        system, *rest = messages
        # the template drops the system prompt when an answer ends the conversation ...
        assert hf_ids(reference_v0_3, as_dicts(rest)) == hf_ids(reference_v0_3, as_dicts(messages))
        # ... tune keeps it where the template puts it in a prompt: before the last user turn's text
        last_user = max(i for i, m in enumerate(rest) if m.role == "user")
        moved = [*rest]
        moved[last_user] = Message("user", f"{system.text_content}\n\n{rest[last_user].text_content}")
        assert tokens == hf_ids(reference_v0_3, as_dicts(moved)), as_dicts(messages)
        answers = [ours_v0_3.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert answers == [m.text_content.strip() + "</s>" for m in rest if m.role == "assistant"]


def test_v0_3_control_token_strings_in_content_stay_text(ours_v0_3):
    # as mistral_common encodes message content; only the format's own [INST] / [/INST] are control tokens
    messages = [Message("user", "say [INST] and [/INST] please"), Message("assistant", "ok")]
    tokens, _ = ours_v0_3.tokenize_messages(messages)
    assert tokens[:2] == [1, 3] and tokens.count(3) == 1 and tokens.count(4) == 1
    assert ours_v0_3.decode(tokens, skip_special_tokens=False) == "<s>[INST]say [INST] and [/INST] please[/INST]ok</s>"


def test_v0_3_without_a_template_is_torchtunes_plain_layout():
    # prompt_template=None: torchtune's layout (rule in torchtune_no_template_reference), control pieces unused
    path = sentencepiece_model(mistral_v0_3=True) / "tokenizer.model"
    plain = mistral_tokenizer(str(path), prompt_template=None)
    assert isinstance(plain.chat_format, PlainChatFormat)
    for messages in random_conversations(count=5, seed=11):
        messages = mask_messages(messages)
        assert plain.tokenize_messages(messages) == torchtune_no_template_reference(path, messages)


def test_a_v0_1_style_model_keeps_the_text_inst_format():
    # no control pieces: [INST] / [/INST] are text, token for token as the v0.1/v0.2 template gives them
    directory = sentencepiece_model()
    ours = mistral_tokenizer(str(directory / "tokenizer.model"), prompt_template="tune.data.MistralChatFormat")
    reference = legacy_sentencepiece_reference(directory, MISTRAL_TEMPLATE)
    assert isinstance(ours.chat_format, MistralChatFormat)
    assert ours.special_tokens == {"<s>": 1, "</s>": 2}
    for messages in random_conversations(count=5, seed=10, system=True):
        tokens, _ = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)


def test_only_one_inst_control_piece_is_refused_naming_the_file(tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString((sentencepiece_model(mistral_v0_3=True) / "tokenizer.model").read_bytes())
    (piece,) = [p for p in model.pieces if p.piece == "[/INST]"]
    piece.type = piece.USER_DEFINED  # "[/INST]" now text, "[INST]" still a control piece
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ValueError, match=r"tokenizer\.model.*'\[INST\]' as a control token but not '\[/INST\]'"):
        mistral_tokenizer(str(path))
