"""The reward functions of tune/rlhf/_rewards.py."""

import pytest
import torch

from tune.rlhf import (
    DATASET_INDEX_KEY,
    AnswerReward,
    FormatReward,
    WeightedRewards,
    extract_answer,
    normalize_answer,
    reward_name,
    score_completions,
)


@pytest.mark.parametrize(
    "text, pattern, expected",
    [
        ("so the total is \\boxed{42}.", None, "42"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", None, "\\frac{1}{2}"),
        ("<think>7 * 6</think><answer> 42 </answer>", None, "42"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", None, "72"),
        ("  seven  ", None, "seven"),
        ("\\boxed{12", None, None),
        ("The answer is 12. The answer is 13.", r"answer is (\d+)", "13"),
        ("no number here", r"answer is (\d+)", None),
    ],
)
def test_extract_answer(text, pattern, expected):
    assert extract_answer(text, pattern) == expected


def test_normalize_answer():
    assert normalize_answer("1,000") == normalize_answer("1000.0") == normalize_answer("$1000.") == "1000"
    assert normalize_answer("0.50") == "0.5"
    assert normalize_answer(" a  b ") == "a b"


def test_answer_reward():
    reward = AnswerReward(incorrect_reward=-0.5)
    completions = ["<answer>72</answer>", "it is \\boxed{72.0}", "#### 71", "nothing"]
    answers = ["Some steps. #### 72"] * 4
    torch.testing.assert_close(reward(["q"] * 4, completions, answer=answers), torch.tensor([1.0, 1.0, -0.5, -0.5]))
    with pytest.raises(ValueError, match="column 'answer'"):
        reward(["q"], ["a"], solution=["a"])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        AnswerReward(pattern="(")


def test_format_reward():
    reward = FormatReward()
    completions = [
        "<think>a\nb</think>\n<answer>3</answer>",
        "<answer>3</answer>",
        "<think>x</think><answer>3</answer>!",
    ]
    torch.testing.assert_close(reward(["q"] * 3, completions), torch.tensor([1.0, 0.0, 0.0]))
    assert FormatReward(pattern=r"\d+", reward=0.5)(["q", "q"], ["12", "1a"]).tolist() == [0.5, 0.0]


def test_score_completions_weighs_and_checks():
    def length_bonus(prompts, completions, **fields):  # a user's reward in TRL's signature: a list of floats
        return [0.1 * len(c) for c in completions]

    completions = ["<answer>3</answer>", "4"]
    total, per_function = score_completions(
        [AnswerReward(), length_bonus], ["q", "q"], completions, {"answer": ["3", "3"]}, weights=[2.0, 1.0]
    )
    torch.testing.assert_close(per_function, torch.tensor([[1.0, 1.8], [0.0, 0.1]]))
    torch.testing.assert_close(total, torch.tensor([3.8, 0.1]))
    assert [reward_name(f) for f in (AnswerReward(), FormatReward(name="tags"), length_bonus)] == [
        "answer",
        "tags",
        "length_bonus",
    ]
    with pytest.raises(ValueError, match="2 entries for 1 reward"):
        score_completions([length_bonus], ["q"], ["a"], {}, weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="'bad' returned rewards of shape"):

        def bad(prompts, completions, **fields):
            return [1.0, 2.0, 3.0]

        score_completions([bad], ["q"], ["a"], {})


def test_weighted_rewards_score_each_rows_group_with_its_columns():
    seen = {}

    def answer_length(prompts, completions, **fields):  # records what a user's reward receives
        seen.update(prompts=prompts, fields=fields)
        return [float(len(a)) for a in fields["answer"]]

    rewards = WeightedRewards([AnswerReward(), answer_length], [1.0, 0.5])
    assert rewards.names == ["answer", "answer_length"] and repr(rewards) == "answer x 1, answer_length x 0.5"
    rows = [
        {"tokens": [1, 2], "prompt": "1 + 2 =", "answer": "3", DATASET_INDEX_KEY: 4},
        {"tokens": [3], "prompt": "5 + 5 =", "answer": "10", DATASET_INDEX_KEY: 0},
    ]
    total, per_function = rewards.score(rows, ["3", "4", "10", "1"], group_size=2)
    torch.testing.assert_close(per_function, torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 2.0], [0.0, 2.0]]))
    torch.testing.assert_close(total, torch.tensor([1.5, 0.5, 2.0, 1.0]))
    # a row's prompt and columns once per completion; its tokens and dataset index are not reward columns
    assert seen == {
        "prompts": ["1 + 2 =", "1 + 2 =", "5 + 5 =", "5 + 5 ="],
        "fields": {"answer": ["3", "3", "10", "10"]},
    }
    assert WeightedRewards([answer_length]).weights == [1.0]
    with pytest.raises(ValueError, match="4 completions for 1 prompts of 2 completions each"):
        rewards.score(rows[:1], ["a"] * 4, group_size=2)


def test_weighted_rewards_refuse_what_cannot_be_scored():
    with pytest.raises(ValueError, match="no reward functions"):
        WeightedRewards([])
    with pytest.raises(ValueError, match="reward function 1 is a str, not a callable"):
        WeightedRewards([AnswerReward(), "my_rewards.length"])
    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        WeightedRewards([AnswerReward()], [1.0, 2.0])
