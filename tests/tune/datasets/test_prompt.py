"""The prompt datasets of tune/datasets/_prompt.py (GRPO's data)."""

import pytest

from tune.data import Message
from tune.datasets import gsm8k_dataset, prompt_dataset
from tune.datasets._prompt import GSM8K_SYSTEM_PROMPT


def _expected(tokenizer, messages: list[Message]) -> list[int]:
    tokens, _ = tokenizer.tokenize_messages(messages + [Message(role="assistant", content="")], add_end_tokens=False)
    return list(tokens)


def test_text_prompts_keep_their_other_columns(tokenizer, write_json):
    rows = [{"prompt": "3 + 4 =", "answer": "7", "level": 1}, {"prompt": "1 + 1 =", "answer": "2", "level": 2}]
    ds = prompt_dataset(tokenizer, source="json", data_files=write_json(rows))
    assert len(ds) == 2
    sample = ds[0]
    assert sample["tokens"] == _expected(tokenizer, [Message(role="user", content="3 + 4 =")])
    assert sample["tokens"][-1] != tokenizer.eos_id  # the answer starts here: no end of turn
    assert (sample["prompt"], sample["answer"], sample["level"]) == ("3 + 4 =", "7", 1)


def test_message_prompts_and_system_prompt(tokenizer, write_json):
    conversation = [{"role": "system", "content": "old"}, {"role": "user", "content": "Hi"}]
    ds = prompt_dataset(
        tokenizer, source="json", data_files=write_json([{"q": conversation, "a": "x"}]), prompt_column="q",
        system_prompt="new",
    )  # fmt: skip
    expected = [Message(role="system", content="new"), Message(role="user", content="Hi")]
    assert ds[0]["tokens"] == _expected(tokenizer, expected)
    assert ds[0]["a"] == "x" and "q" not in ds[0]


def test_bad_prompts_are_reported(tokenizer, write_json):
    with pytest.raises(ValueError, match="no column"):
        prompt_dataset(tokenizer, source="json", data_files=write_json([{"question": "q"}]))
    ds = prompt_dataset(tokenizer, source="json", data_files=write_json([{"prompt": 3}]))
    with pytest.raises(ValueError, match="row 0"):
        ds[0]


def test_gsm8k_reads_question_and_keeps_the_worked_answer(tokenizer, tmp_path, write_json):
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}]
    ds = gsm8k_dataset(tokenizer, source="json", name=None, data_files=write_json(rows))
    messages = [Message(role="system", content=GSM8K_SYSTEM_PROMPT), Message(role="user", content=rows[0]["question"])]
    assert ds[0]["tokens"] == _expected(tokenizer, messages)
    assert ds[0]["answer"].endswith("#### 7")


def test_prompts_longer_than_max_seq_len_are_left_out_with_a_warning(write_json, caplog):
    # a prompt cut to max_seq_len loses its end (the question, the chat format's answer header): the model would
    # continue the cut text. Such rows are left out, counted, with the longest length and the fix
    from tests.tune.datasets._helpers import ByteTokenizer

    tokenizer = ByteTokenizer(max_seq_len=12)
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "x" * 40, "answer": "?"}, {"prompt": "2+2=", "answer": "4"}]
    with caplog.at_level("WARNING"):
        ds = prompt_dataset(tokenizer, source="json", data_files=write_json(rows))
    assert [ds[i]["answer"] for i in range(len(ds))] == ["2", "4"]
    untruncated = ByteTokenizer(max_seq_len=None)
    assert ds[0]["tokens"] == _expected(untruncated, [Message(role="user", content="1+1=")])
    longest = len(_expected(untruncated, [Message(role="user", content="x" * 40)]))
    assert f"1 of 3 prompts are longer than tokenizer.max_seq_len=12 (the longest: {longest} tokens)" in caplog.text


def test_no_prompt_within_max_seq_len_is_an_error(write_json):
    from tests.tune.datasets._helpers import ByteTokenizer

    tokenizer = ByteTokenizer(max_seq_len=4)
    with pytest.raises(ValueError, match=r"every prompt .* is longer than tokenizer.max_seq_len=4"):
        prompt_dataset(tokenizer, source="json", data_files=write_json([{"prompt": "a long question"}]))
