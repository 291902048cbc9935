import pytest

from tune.data import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    ShareGPTToMessages,
    alpaca_prompt,
)


def _summary(messages: list[Message]) -> list[tuple[str, str, bool]]:
    return [(m.role, m.text_content, m.masked) for m in messages]


class TestAlpacaPrompt:
    def test_with_input_has_input_section(self):
        # The Stanford Alpaca template (tatsu-lab/stanford_alpaca, train.py PROMPT_DICT["prompt_input"]).
        assert alpaca_prompt("Add.", "2 and 3") == (
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nAdd.\n\n### Input:\n2 and 3\n\n### Response:\n"
        )

    def test_without_input_has_no_input_section(self):
        assert alpaca_prompt("Say hi.") == (
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nSay hi.\n\n### Response:\n"
        )


class TestInputOutputToMessages:
    def test_masks_input_unless_train_on_input(self):
        row = {"input": "Q?", "output": "A."}
        assert _summary(InputOutputToMessages()(row)["messages"]) == [("user", "Q?", True), ("assistant", "A.", False)]
        trained = InputOutputToMessages(train_on_input=True)(row)["messages"]
        assert [m.masked for m in trained] == [False, False]

    def test_column_map_and_system_prompt(self):
        t = InputOutputToMessages(column_map={"input": "q", "output": "a"}, new_system_prompt="Be brief.")
        assert t.required_columns == ["q", "a"]
        assert _summary(t({"q": "Q?", "a": "A."})["messages"]) == [
            ("system", "Be brief.", True),
            ("user", "Q?", True),
            ("assistant", "A.", False),
        ]

    def test_unknown_column_map_key_lists_accepted_keys(self):
        with pytest.raises(ValueError, match=r"unknown key\(s\) \['prompt'\].*\['input', 'output'\]"):
            InputOutputToMessages(column_map={"prompt": "x"})

    @pytest.mark.parametrize(
        "bad, match", [("", "'output' is empty"), ("   ", "is empty"), (7, "must hold a string, got int")]
    )
    def test_bad_content_names_column(self, bad, match):
        with pytest.raises(ValueError, match=match):
            InputOutputToMessages()({"input": "Q?", "output": bad})


class TestAlpacaToMessages:
    def test_prompt_with_and_without_input(self):
        t = AlpacaToMessages(train_on_input=False)
        with_input = t({"instruction": "Add.", "input": "2 and 3", "output": "5"})["messages"]
        assert _summary(with_input) == [("user", alpaca_prompt("Add.", "2 and 3"), True), ("assistant", "5", False)]
        without = t({"instruction": "Add.", "input": "", "output": "5"})["messages"]
        assert without[0].text_content == alpaca_prompt("Add.")
        none_input = t({"instruction": "Add.", "input": None, "output": "5"})["messages"]
        assert none_input[0].text_content == alpaca_prompt("Add.")

    def test_input_column_is_optional(self):
        t = AlpacaToMessages()
        assert t.required_columns == ["instruction", "output"]
        assert t({"instruction": "Add.", "output": "5"})["messages"][0].text_content == alpaca_prompt("Add.")

    def test_default_trains_on_input(self):
        assert not AlpacaToMessages()({"instruction": "a", "output": "b"})["messages"][0].masked


class TestConversations:
    def test_sharegpt_multi_turn(self):
        row = {"conversations": [
            {"from": "system", "value": "S"}, {"from": "human", "value": "U1"}, {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "U2"}, {"from": "gpt", "value": "A2"},
        ]}  # fmt: skip
        assert _summary(ShareGPTToMessages()(row)["messages"]) == [
            ("system", "S", True), ("user", "U1", True), ("assistant", "A1", False),
            ("user", "U2", True), ("assistant", "A2", False),
        ]  # fmt: skip
        assert all(not m.masked for m in ShareGPTToMessages(train_on_input=True)(row)["messages"])

    def test_new_system_prompt_replaces_data_system_turn(self):
        row = {"messages": [{"role": "system", "content": "old"}, {"role": "user", "content": "U"},
                            {"role": "assistant", "content": "A"}]}  # fmt: skip
        out = OpenAIToMessages(new_system_prompt="new", train_on_input=True)(row)["messages"]
        assert _summary(out) == [("system", "new", True), ("user", "U", False), ("assistant", "A", False)]

    @pytest.mark.parametrize(
        "turns, match",
        [
            ([], "non-empty list"),
            ([{"role": "user", "content": "U"}, {"role": "assistant", "content": ""}], "turn 1: content is empty"),
            (
                [{"role": "user", "content": None}, {"role": "assistant", "content": "A"}],
                "turn 0: content must be a string",
            ),
            ([{"role": "robot", "content": "x"}], "unknown role 'robot'"),
            ([{"role": "user", "content": "U"}], "no assistant turn"),
            ([{"speaker": "user"}], "expected a dict with keys 'role' and 'content'"),
        ],
    )
    def test_bad_conversations(self, turns, match):
        with pytest.raises(ValueError, match=match):
            OpenAIToMessages()({"messages": turns})

    def test_chosen_rejected(self):
        prompt = [{"role": "user", "content": "Q"}]
        row = {"c": prompt + [{"role": "assistant", "content": "good"}],
               "r": prompt + [{"role": "assistant", "content": "bad"}]}  # fmt: skip
        out = ChosenRejectedToMessages(column_map={"chosen": "c", "rejected": "r"})(row)
        assert _summary(out["chosen"]) == [("user", "Q", True), ("assistant", "good", False)]
        assert _summary(out["rejected"]) == [("user", "Q", True), ("assistant", "bad", False)]


class TestMaskingStrategy:
    ROW = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                        {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
                        {"role": "assistant", "content": "A2"}]}  # fmt: skip

    @pytest.mark.parametrize(
        "strategy, masked",
        [("train_on_last", [True, True, True, True, False]), ("train_on_all", [False] * 5),
         ("train_on_assistant", [True, True, False, True, False])],
    )  # fmt: skip
    def test_strategies(self, strategy, masked):
        out = OpenAIToMessages(masking_strategy=strategy)(self.ROW)["messages"]
        assert [m.masked for m in out] == masked

    def test_injected_system_prompt_stays_masked(self):
        out = ShareGPTToMessages(masking_strategy="train_on_all", new_system_prompt="N")(
            {"conversations": [{"from": "human", "value": "U"}, {"from": "gpt", "value": "A"}]}
        )["messages"]
        assert [m.masked for m in out] == [True, False, False]

    def test_conflict_and_unknown(self):
        with pytest.raises(ValueError, match="either train_on_input=True or masking_strategy"):
            OpenAIToMessages(train_on_input=True, masking_strategy="train_on_last")
        with pytest.raises(ValueError, match="Unknown masking strategy"):
            OpenAIToMessages(masking_strategy="sometimes")


def test_image_dir_makes_the_image_column_required():
    from tune.data import InputOutputToMessages, ShareGPTToMessages

    # images themselves are tested in tests/tune/data/test_image.py
    for transform, text_columns in ((InputOutputToMessages, ["input", "output"]),
                                    (ShareGPTToMessages, ["conversations"])):  # fmt: skip
        assert transform(False, None, None, None).required_columns == text_columns
        assert transform(False, None, None, "imgs").required_columns == [*text_columns, "image"]
    # torchtune's positional order: train_on_input, column_map, new_system_prompt, image_dir, image_tag
    assert ShareGPTToMessages(True, None, None, None, "<img>").image_tag == "<img>"
