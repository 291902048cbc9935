"""The GRPO policy of tune/rlhf/_grpo.py that the recipes share: the sampling rule, the indexed prompt rows, the
trajectory's log-probabilities, the decoding of completions and the logged statistics. (The advantages, completion
mask and loss are tested in tests/tune/rlhf/loss/test_grpo.py.)"""

import pytest
import torch

from tests.tune.generation._torchtune_reference import tiny_decoder
from tune.generation import generate, left_pad
from tune.rlhf import (
    DATASET_INDEX_KEY,
    GRPOTrajectory,
    IndexedPrompts,
    completion_generators,
    completion_mask,
    completion_seed,
    decode_completions,
    grpo_metrics,
    grpo_trajectory,
    trajectory_log_probs,
)

PROMPTS = {3: [5, 9, 3, 7, 1, 2], 7: [11, 4, 8], 12: [6, 6, 2, 9]}  # dataset index -> prompt tokens
STOP = 23


@pytest.fixture(scope="module")
def model():
    return tiny_decoder()


def test_completion_seed_names_one_completion_of_the_run():
    seed = completion_seed(42, 1, 7, 2)
    assert seed == completion_seed(42, 1, 7, 2)  # no state: the same in any process, after any resume
    assert 0 <= seed < 2**63
    others = {completion_seed(*args) for args in [(43, 1, 7, 2), (42, 0, 7, 2), (42, 1, 8, 2), (42, 1, 7, 3)]}
    assert seed not in others and len(others) == 4  # each of the four changes it
    # the arguments are not summed or mixed linearly: swapping two of them changes the seed
    assert completion_seed(1, 2, 3, 4) != completion_seed(2, 1, 3, 4) != completion_seed(1, 2, 4, 3)


def _sample(model, indices: list[int], group: int, micro_batch: int) -> torch.Tensor:
    """Completions of the prompts with these dataset indices, sampled in micro-batches of ``micro_batch`` rows."""
    generators = completion_generators(0, 1, indices, group)
    prompts = [PROMPTS[index] for index in indices for _ in range(group)]
    tokens, _ = left_pad(prompts, 0, torch.device("cpu"))
    rows = []
    for start in range(0, len(prompts), micro_batch):
        out, _ = generate(
            model,
            tokens[start : start + micro_batch],
            max_generated_tokens=6,
            temperature=1.0,
            rng=generators[start : start + micro_batch],
            return_logits=False,
        )
        rows += list(out[:, tokens.shape[1] :])
    return torch.stack(rows)


def test_a_prompts_completions_do_not_depend_on_its_batch(model):
    """What a prompt samples is the same in a batch of three prompts generated 5 rows at a time (its group split
    over two micro-batches) and alone in one batch: the layout of a 1-device run and of one rank of 3."""
    together = _sample(model, [3, 7, 12], group=3, micro_batch=5)  # [9, 6]
    for position, index in enumerate([3, 7, 12]):
        alone = _sample(model, [index], group=3, micro_batch=3)
        assert torch.equal(together[3 * position : 3 * position + 3], alone), index
    assert len({tuple(row.tolist()) for row in together[:3]}) == 3  # a group's completions differ
    assert len(completion_generators(0, 1, [3, 7], 4)) == 8


def test_completions_change_with_the_epoch(model):
    generators = [completion_generators(0, epoch, [7], 1)[0] for epoch in (0, 1)]
    draws = [torch.rand(4, generator=g) for g in generators]
    assert not torch.equal(*draws)


def test_indexed_prompts_carry_their_dataset_index():
    rows = IndexedPrompts([{"tokens": [1, 2], "prompt": "a"}, {"tokens": [3], "prompt": "b"}])
    assert len(rows) == 2
    assert rows[1] == {"tokens": [3], "prompt": "b", DATASET_INDEX_KEY: 1}


def test_a_trajectorys_log_probs_equal_each_row_scored_alone(model):
    prompts = [PROMPTS[3], PROMPTS[7]]
    tokens, padding = left_pad(prompts, 0, torch.device("cpu"))
    completions = torch.tensor([[4, 9, STOP, 0], [8, 8, 1, 5]])
    trajectory = grpo_trajectory(tokens, padding, completions, completion_mask(completions, [STOP]), torch.zeros(2))
    assert isinstance(trajectory, GRPOTrajectory) and trajectory.ref_logprobs is None
    assert trajectory.sequences.shape == (2, 10) and trajectory.positions[1].tolist() == [0, 0, 0, *range(7)]
    with torch.no_grad():
        logprobs = trajectory_log_probs(model, trajectory, slice(0, 2), temperature=0.7)
        assert logprobs.shape == (2, 4)
        for row, prompt in enumerate(prompts):  # unpadded, the whole sequence through the model
            sequence = torch.tensor([prompt + completions[row].tolist()])
            logits = model(sequence)[0, len(prompt) - 1 : -1] / 0.7
            expected = torch.log_softmax(logits, dim=-1).gather(1, completions[row][:, None])[:, 0]
            torch.testing.assert_close(logprobs[row], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(trajectory_log_probs(model, trajectory, slice(1, 2), 0.7), logprobs[1:])


class _Tokenizer:
    """Decodes ids below 10 as letters; a larger id (an embedding row past the vocabulary) raises KeyError."""

    def decode(self, ids: list[int]) -> str:
        if any(i >= 10 for i in ids):
            raise KeyError(max(ids))
        return "".join("abcdefghij"[i] for i in ids)


def test_decode_completions_drops_the_stop_token_what_follows_and_ids_without_text():
    completions = torch.tensor([[1, 2, STOP, 4], [3, 12, 0, 5], [STOP, 1, 1, 1]])
    texts = decode_completions(_Tokenizer(), completions, completion_mask(completions, [STOP]), [STOP])
    assert texts == ["bc", "daf", ""]  # row 2: id 12 has no text


def test_grpo_metrics():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    per_function = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    completions = torch.tensor([[1, STOP, 0], [1, 2, 3], [STOP, 0, 0], [4, 5, 6]])
    mask = completion_mask(completions, [STOP])
    values = grpo_metrics(rewards, per_function, ["answer", "format"], completions, mask, [STOP])
    assert {k: round(v.item(), 4) for k, v in values.items()} == {
        "reward": 0.5,
        "reward_std": round(rewards.std().item(), 4),
        "rewards/answer/mean": 0.25,
        "rewards/answer/std": 0.5,
        "rewards/format/mean": 0.5,
        "rewards/format/std": round(per_function[:, 1].std().item(), 4),
        "completions/mean_length": 2.25,  # 2, 3, 1, 3 tokens (a stop token counts)
        "completions/clipped_ratio": 0.5,  # rows 1 and 3 never stopped
    }
