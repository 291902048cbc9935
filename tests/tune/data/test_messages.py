import pickle

import pytest

from tune.data import Message, validate_messages


class TestContent:
    def test_string_content_is_one_text_part(self):
        m = Message("user", "hi")
        assert m.content == [{"type": "text", "content": "hi"}]
        assert m.text_content == "hi"
        assert not m.contains_media and m.get_media() == []

    def test_parts_are_kept_and_text_is_joined(self):
        image = object()
        parts = [
            {"type": "text", "content": "a "},
            {"type": "image", "content": image},
            {"type": "text", "content": "b"},
        ]
        m = Message("user", parts)
        assert m.content is parts
        assert m.text_content == "a b"
        assert m.contains_media and m.get_media() == [image]

    def test_assigning_content_updates_the_text(self):
        m = Message("assistant", "old")
        m.content = [{"type": "text", "content": "new"}, {"type": "text", "content": "!"}]
        assert m.text_content == "new!"
        m.content = "plain"
        assert m.content == [{"type": "text", "content": "plain"}]

    @pytest.mark.parametrize(
        "content, match",
        [
            (42, "must be a string or a list"),
            ([{"content": "x"}], "part 0 of a 'user' message must be a dict with 'type' and 'content'"),
            ([{"type": "text", "content": None}], "text part 0 of a 'user' message must hold a string"),
        ],
    )
    def test_bad_content_is_refused(self, content, match):
        with pytest.raises(ValueError, match=match):
            Message("user", content)


class TestFields:
    def test_positional_order_is_role_content_masked_ipython_eot(self):
        m = Message("assistant", "f()", True, True, False)
        assert (m.masked, m.ipython, m.eot) == (True, True, False)

    def test_only_assistant_messages_can_be_tool_calls(self):
        with pytest.raises(ValueError, match="Only assistant messages can be tool calls"):
            Message("user", "x", ipython=True)
        with pytest.raises(ValueError, match="cannot hold media"):
            Message("assistant", [{"type": "image", "content": object()}], ipython=True)

    def test_dict_round_trip_equality_and_pickle(self):
        m = Message("assistant", "x", masked=True, ipython=True, eot=False)
        assert Message.from_dict(m.to_dict()) == m
        assert Message.from_dict({"role": "user", "content": "x"}) == Message("user", "x")
        assert Message("user", "x") == Message("user", [{"type": "text", "content": "x"}])
        assert Message("user", "x") != Message("user", "x", masked=True)
        assert pickle.loads(pickle.dumps(m)) == m  # data loader workers pickle samples
        assert repr(Message("user", "x", masked=True)) == "Message(role='user', content='x', masked=True)"


class TestValidateMessages:
    def test_a_back_and_forth_conversation_passes(self):
        validate_messages([Message("system", "s"), Message("user", "u"), Message("assistant", "a")])

    @pytest.mark.parametrize(
        "roles, match",
        [
            (["user"], "at least 2 messages"),
            (["user", "system", "assistant"], "message 1 is a system message"),
            (["user", "user", "assistant"], "messages 0 and 1 are both user messages"),
            (["assistant", "user"], "message 0 is an assistant message that does not follow a user message"),
            (["user", "assistant", "assistant"], "message 2 is an assistant message"),
        ],
    )
    def test_bad_conversations_raise(self, roles, match):
        with pytest.raises(ValueError, match=match):
            validate_messages([Message(role, "x") for role in roles])
