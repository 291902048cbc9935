import pytest

from tests.tune.data import _tiny_tokenizers as tiny
from tune.data import (
    ChatMLTemplate,
    GrammarErrorCorrectionTemplate,
    Message,
    PromptTemplate,
    QuestionAnswerTemplate,
    SummarizeTemplate,
)
from tune.models.llama2 import llama2_tokenizer
from tune.models.llama3 import llama3_tokenizer


def _texts(messages):
    return [(m.role, m.text_content, m.masked) for m in messages]


def _conversation():
    return [
        Message("system", "Be brief.", masked=True),
        Message("user", "Why?", masked=True),
        Message("assistant", "Because."),
    ]


class TestTemplates:
    def test_prompt_template_wraps_the_roles_it_names(self):
        template = PromptTemplate({"user": ("Q: ", "\nA: "), "assistant": ("", " <end>")})
        messages = _conversation()
        out = template(messages)
        assert _texts(out) == [
            ("system", "Be brief.", True),
            ("user", "Q: Why?\nA: ", True),
            ("assistant", "Because. <end>", False),
        ]
        assert out[1].content == [
            {"type": "text", "content": "Q: "},
            {"type": "text", "content": "Why?"},
            {"type": "text", "content": "\nA: "},
        ]
        assert messages[1].text_content == "Why?"  # the input is not changed

    @pytest.mark.parametrize(
        "template, user",
        [
            (GrammarErrorCorrectionTemplate, "Correct this to standard English: Why?\n---\nCorrected: "),
            (SummarizeTemplate, "Summarize this dialogue:\nWhy?\n---\nSummary:\n"),
            (QuestionAnswerTemplate, "Question: Why?\n\nAnswer: "),
        ],
    )
    def test_task_templates(self, template, user):
        out = template()(_conversation())
        assert _texts(out)[1:] == [("user", user, True), ("assistant", "Because.", False)]

    def test_chatml_leaves_a_final_empty_assistant_turn_open(self):
        messages = [Message("user", "hi"), Message("assistant", "", eot=False)]
        out = ChatMLTemplate()(messages)
        assert [m.text_content for m in out] == ["<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>assistant\n"]
        out = ChatMLTemplate()([Message("user", "hi"), Message("assistant", "yo")])
        assert out[1].text_content == "<|im_start|>assistant\nyo<|im_end|>\n"

    def test_bad_template_is_refused(self):
        with pytest.raises(ValueError, match=r"template\['user'\] must be a \(prepend, append\) pair"):
            PromptTemplate({"user": "Q: "})


class TestTokenizersApplyTemplates:
    @pytest.mark.parametrize(
        "prompt_template",
        ["tune.data.QuestionAnswerTemplate", QuestionAnswerTemplate(), {"user": ("Question: ", "\n\nAnswer: ")}],
    )
    def test_llama3_tokenizes_the_templated_text(self, prompt_template):
        templated = llama3_tokenizer(str(tiny.tiktoken_file()), prompt_template=prompt_template)
        plain = llama3_tokenizer(str(tiny.tiktoken_file()))
        # torchtune's layout: the template's text as parts of their own, each encoded on its own
        parts = [{"type": "text", "content": text} for text in ("Question: ", "Why?", "\n\nAnswer: ")]
        wrapped = [Message("user", parts, masked=True), Message("assistant", "Because.")]
        assert templated.tokenize_messages(_conversation()[1:]) == plain.tokenize_messages(wrapped)

    def test_llama2_without_chat_template_follows_torchtune_layout(self):
        model = tiny.sentencepiece_model() / "tokenizer.model"
        tok = llama2_tokenizer(str(model), prompt_template="tune.data.GrammarErrorCorrectionTemplate")
        messages = [Message("user", "he go home", masked=True), Message("assistant", "He goes home.")]
        # torchtune's templates add their text as parts of their own, each encoded on its own
        parts = ["Correct this to standard English: ", "he go home", "\n---\nCorrected: "]
        wrapped = [Message("user", [{"type": "text", "content": p} for p in parts], masked=True), messages[1]]
        assert tok.tokenize_messages(messages) == tiny.torchtune_no_template_reference(model, wrapped)

    def test_llama3_tool_call_opens_with_python_tag(self):
        tok = llama3_tokenizer(str(tiny.tiktoken_file()), prompt_template="tune.data.Llama3ChatFormat")
        messages = [Message("user", "call it", masked=True), Message("assistant", "f()", ipython=True)]
        tokens, mask = tok.tokenize_messages(messages)
        tag = tok.special_tokens["<|python_tag|>"]
        assert tokens.count(tag) == 1 and not mask[tokens.index(tag)]
        assert tok.decode(tokens, skip_special_tokens=False).endswith("<|python_tag|>f()<|eot_id|>")
