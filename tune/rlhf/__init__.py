"""Alignment after supervised fine-tuning (torchtune's ``torchtune.rlhf``): sequence log-probabilities, masked
statistics and the preference metrics; the losses live in :mod:`tune.rlhf.loss`.
"""

from tune.rlhf._metrics import PreferenceMetrics
from tune.rlhf._sequence_processing import (
    get_batch_log_probs,
    get_reward_penalty_mask,
    logits_to_logprobs,
    truncate_sequence_at_first_stop_token,
    truncate_sequence_for_logprobs,
)
from tune.rlhf._stats import masked_mean, masked_var, whiten

__all__ = [
    "PreferenceMetrics",
    "get_batch_log_probs",
    "get_reward_penalty_mask",
    "logits_to_logprobs",
    "masked_mean",
    "masked_var",
    "truncate_sequence_at_first_stop_token",
    "truncate_sequence_for_logprobs",
    "whiten",
]
