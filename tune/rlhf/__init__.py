"""Alignment after supervised fine-tuning (torchtune's ``torchtune.rlhf``): sequence log-probabilities (from logits, or
from hidden states projecting only the completions), masked statistics and the preference metrics, and the policy the
GRPO recipes share (rewards, sampling rule, trajectory, decoding, metrics); the losses live in :mod:`tune.rlhf.loss`.
"""

from tune.rlhf._data import PREFERENCE_KEYS, check_preference_dataset, check_prompt_dataset
from tune.rlhf._grpo import (
    DATASET_INDEX_KEY,
    GRPOTrajectory,
    IndexedPrompts,
    completion_generators,
    completion_log_probs,
    completion_mask,
    completion_seed,
    decode_completions,
    grpo_advantages,
    grpo_metrics,
    grpo_trajectory,
    trajectory_log_probs,
)
from tune.rlhf._kto import DesirableRate, KTOMetrics, check_unpaired_dataset
from tune.rlhf._metrics import PreferenceMetrics
from tune.rlhf._ppo import PPOStats, Trajectory, estimate_advantages, get_rewards_ppo
from tune.rlhf._reference import IndexedPairs, collate_with_indices, precompute_reference_log_probs
from tune.rlhf._reward_model import RewardModelReward
from tune.rlhf._rewards import (
    THINK_ANSWER_FORMAT,
    AnswerReward,
    FormatReward,
    RewardFunction,
    WeightedRewards,
    extract_answer,
    normalize_answer,
    reward_name,
    score_completions,
)
from tune.rlhf._sequence_processing import (
    SequenceLogProbs,
    chosen_nll_labels,
    completion_logit_sums,
    get_batch_log_probs,
    get_reward_penalty_mask,
    logits_to_logprobs,
    model_sequence_log_probs,
    sequence_log_probs,
    truncate_sequence_at_first_stop_token,
    truncate_sequence_for_logprobs,
)
from tune.rlhf._stats import masked_mean, masked_var, whiten

__all__ = [
    "IndexedPairs",
    "collate_with_indices",
    "precompute_reference_log_probs",
    "AnswerReward",
    "FormatReward",
    "RewardFunction",
    "RewardModelReward",
    "THINK_ANSWER_FORMAT",
    "WeightedRewards",
    "DATASET_INDEX_KEY",
    "GRPOTrajectory",
    "IndexedPrompts",
    "check_prompt_dataset",
    "completion_generators",
    "completion_log_probs",
    "completion_mask",
    "completion_seed",
    "decode_completions",
    "extract_answer",
    "grpo_advantages",
    "grpo_metrics",
    "grpo_trajectory",
    "trajectory_log_probs",
    "normalize_answer",
    "reward_name",
    "score_completions",
    "PPOStats",
    "Trajectory",
    "estimate_advantages",
    "get_rewards_ppo",
    "DesirableRate",
    "KTOMetrics",
    "check_unpaired_dataset",
    "PREFERENCE_KEYS",
    "PreferenceMetrics",
    "check_preference_dataset",
    "SequenceLogProbs",
    "chosen_nll_labels",
    "completion_logit_sums",
    "get_batch_log_probs",
    "get_reward_penalty_mask",
    "logits_to_logprobs",
    "model_sequence_log_probs",
    "sequence_log_probs",
    "masked_mean",
    "masked_var",
    "truncate_sequence_at_first_stop_token",
    "truncate_sequence_for_logprobs",
    "whiten",
]
