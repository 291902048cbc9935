"""Chat formats, masking strategies, validation and truncation (family parity: tests/tune/models/)."""

import pytest

from tests.tune.data._tiny_tokenizers import conversation, tiktoken_file, trained_runs
from tune.data import Llama3ChatFormat, MaskingStrategy, Message, Segment, mask_messages
from tune.models.llama3._tokenizer import llama3_tokenizer


@pytest.fixture(scope="module")
def tok():
    # tune's Hugging Face-exact format (the builder's default is torchtune's layout: test_torchtune_tokens.py)
    return llama3_tokenizer(str(tiktoken_file()), prompt_template="tune.data.Llama3ChatFormat")


def _runs(tok, tokens, mask):
    return [tok.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


def shout(messages):
    """A prompt template for the tests: upper-cases user turns."""
    return [Message(m.role, m.text_content.upper(), m.masked) if m.role == "user" else m for m in messages]


class TestMaskingStrategies:
    def test_train_on_assistant_is_the_default(self):
        messages = mask_messages(conversation())
        assert [m.masked for m in messages] == [True, True, False, True, False]

    @pytest.mark.parametrize("name", ["train_on_all", "all", MaskingStrategy.TRAIN_ON_ALL])
    def test_train_on_all(self, name):
        assert not any(m.masked for m in mask_messages(conversation(), name))

    def test_train_on_last_masks_every_message_but_the_last(self):
        assert [m.masked for m in mask_messages(conversation(), "last")] == [True, True, True, True, False]

    def test_unknown_strategy(self):
        with pytest.raises(ValueError, match="Unknown masking strategy 'everything'.*train_on_all"):
            mask_messages(conversation(), "everything")

    def test_train_on_all_trains_every_token_after_the_first_header(self, tok):
        tokens, mask = tok.tokenize_messages(mask_messages(conversation(), "all"))
        masked = [t for t, m in zip(tokens, mask) if m]
        # BOS and the first header open the conversation: nothing precedes them to train from
        assert tok.decode(masked, skip_special_tokens=False) == (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        )
        assert mask == [True] * len(masked) + [False] * (len(tokens) - len(masked))

    def test_train_on_last_trains_only_the_last_answer_tokens(self, tok):
        messages = mask_messages(conversation(), "last")
        tokens, mask = tok.tokenize_messages(messages)
        assert _runs(tok, tokens, mask) == [messages[-1].text_content + "<|eot_id|>"]

    def test_train_on_input_style_trains_the_answer_header(self, tok):
        # a trained user turn followed by a trained answer: the answer's header is trained too
        messages = [Message("user", "q"), Message("assistant", "a")]
        tokens, mask = tok.tokenize_messages(messages)
        assert _runs(tok, tokens, mask) == ["q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|>"]


class TestValidation:
    def test_empty_content_names_the_message(self, tok):
        with pytest.raises(ValueError, match=r"message 1 \(user\) has empty content '  '"):
            tok.tokenize_messages([Message("system", "s"), Message("user", "  ")])

    def test_empty_last_assistant_turn_is_a_generation_prompt_when_the_end_is_left_open(self, tok):
        # torchtune's generation recipe sends [user, assistant ""] with the end left open: the same tokens as an
        # open assistant turn (eot=False); with end tokens it is still an empty message
        user = Message("user", "Hi there")
        open_turn = tok.tokenize_messages([user, Message("assistant", "", eot=False)], add_end_tokens=False)
        assert tok.tokenize_messages([user, Message("assistant", "")], add_end_tokens=False) == open_turn
        with pytest.raises(ValueError, match=r"message 1 \(assistant\) has empty content"):
            tok.tokenize_messages([user, Message("assistant", "")])

    def test_non_string_content_is_refused(self):
        with pytest.raises(ValueError, match="content must be a string or a list"):
            Message("user", 42)
        message = Message("user", "x")
        with pytest.raises(ValueError, match="content must be a string or a list"):
            message.content = 42
        with pytest.raises(ValueError, match="text part 0 of a 'user' message must hold a string, got int"):
            Message("user", [{"type": "text", "content": 42}])

    def test_media_content_names_the_message(self, tok):
        image = Message("user", [{"type": "image", "content": object()}, {"type": "text", "content": "what?"}])
        with pytest.raises(ValueError, match=r"message 0 \(user\) holds image content; tune's tokenizers are text"):
            tok.tokenize_messages([image])

    def test_unknown_role_is_refused(self, tok):
        with pytest.raises(ValueError, match="Unknown message role 'robot'"):
            Message("robot", "x")
        message = Message("user", "x")
        message.role = "robot"
        with pytest.raises(ValueError, match="role 'robot'.*supported roles: assistant, ipython, system"):
            tok.tokenize_messages([message])

    def test_conversation_shape(self, tok):
        with pytest.raises(ValueError, match="messages is empty"):
            tok.tokenize_messages([])
        with pytest.raises(TypeError, match="must be a list of Message"):
            tok.tokenize_messages("hello")
        with pytest.raises(TypeError, match="message 0 must be a Message"):
            tok.tokenize_messages([("user", "x")])
        with pytest.raises(ValueError, match="message 1 has no 'content' key"):
            tok.tokenize_messages([{"role": "user", "content": "x"}, {"role": "assistant"}])

    def test_dicts_are_accepted(self, tok):
        as_messages = tok.tokenize_messages([Message("user", "q"), Message("assistant", "a")])
        as_dicts = tok.tokenize_messages([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
        assert as_messages == as_dicts

    def test_open_assistant_prefix_is_allowed_last(self, tok):
        messages = [Message("user", "q", masked=True), Message("assistant", "", eot=False)]
        tokens, mask = tok.tokenize_messages(messages)
        header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
        assert tok.decode(tokens, skip_special_tokens=False).endswith(header)
        assert all(mask)


class TestOpenEndsAndTruncation:
    def test_add_end_tokens_false_continues_the_last_answer(self, tok):
        messages = mask_messages(conversation())
        closed, _ = tok.tokenize_messages(messages)
        opened, _ = tok.tokenize_messages(messages, add_end_tokens=False)
        assert closed == opened + [tok.special_tokens["<|eot_id|>"]]

    def test_truncation(self, tok):
        messages = mask_messages(conversation())
        full, full_mask = tok.tokenize_messages(messages)
        short = llama3_tokenizer(str(tiktoken_file()), max_seq_len=20, prompt_template="tune.data.Llama3ChatFormat")
        tokens, mask = short.tokenize_messages(messages)
        assert tokens == full[:19] + [short.eos_id] and mask == full_mask[:19] + [True]
        tokens, mask = short.tokenize_messages(messages, add_end_tokens=False)
        assert len(tokens) == 20 and tokens[-1] != short.eos_id
        with pytest.raises(ValueError, match="max_seq_len must be a positive integer"):
            llama3_tokenizer(str(tiktoken_file()), max_seq_len=0)


class TestTransformInterface:
    def test_call_adds_tokens_and_mask(self, tok):
        sample = {"messages": mask_messages(conversation()), "id": 3}
        out = tok(sample)
        assert out["id"] == 3 and "messages" not in out
        assert (out["tokens"], out["mask"]) == tok.tokenize_messages(sample["messages"])
        prompt, _ = tok.tokenize_messages(sample["messages"], add_end_tokens=False)
        assert tok(sample, inference=True)["tokens"] == prompt

    @pytest.mark.parametrize("template", [shout, "tests.tune.data.test_chat_formats.shout"])
    def test_prompt_template(self, template):
        tok = llama3_tokenizer(str(tiktoken_file()), prompt_template=template)
        tokens, _ = tok.tokenize_messages([Message("user", "quiet please")])
        assert "QUIET PLEASE" in tok.decode(tokens)

    def test_bad_prompt_template(self):
        with pytest.raises(ValueError, match="could not be imported"):
            llama3_tokenizer(str(tiktoken_file()), prompt_template="tune.nowhere.Template")
        with pytest.raises(ValueError, match="prompt_template must be a callable"):
            llama3_tokenizer(str(tiktoken_file()), prompt_template=3)


def test_llama3_segments_by_hand():
    messages = [Message("user", " Hi ", masked=True), Message("assistant", "Hello")]
    assert Llama3ChatFormat().render(messages) == [
        Segment("<|begin_of_text|>", False, True),
        Segment("<|start_header_id|>", False, True),
        Segment("user", False),
        Segment("<|end_header_id|>", False, True),
        Segment("\n\n", False),
        Segment("Hi", False),  # the template trims content
        Segment("<|eot_id|>", False, True),
        Segment("<|start_header_id|>", False, True),  # the answer's header follows a masked turn: not trained
        Segment("assistant", False),
        Segment("<|end_header_id|>", False, True),
        Segment("\n\n", False),
        Segment("Hello", True),
        Segment("<|eot_id|>", True, True),
    ]
