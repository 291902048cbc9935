"""Proximal Policy Optimisation over generated text: the trajectory a PPO step learns from, per-token rewards with
a KL penalty, and generalised advantage estimation.

Shapes: ``b`` trajectories (prompt + generated response), ``r`` response positions. Position ``t`` of a per-token
tensor refers to response token ``t``: its log-probability, the value of the state before it, its reward.
"""

from typing import NamedTuple

import torch

from tune.rlhf._stats import whiten


class Trajectory(NamedTuple):
    """What a batch of generated responses leaves for the PPO updates (torchtune's field names and meanings).

    Attributes:
        query_responses (torch.Tensor): prompt followed by response, ``[b, prompt_len + r]``.
        logprobs (torch.Tensor): log-probabilities of the response tokens under the policy that generated them,
            ``[b, r]``.
        ref_logprobs (torch.Tensor): the same under the frozen reference policy, ``[b, r]``.
        values (torch.Tensor): the value model's estimate of the state before each response token, ``[b, r]``.
        masks (torch.Tensor): attention masks of ``query_responses``, ``[b, s, s]`` (``s = prompt_len + r``).
        position_ids (torch.Tensor): positions of ``query_responses``, ``[b, s]``.
        response_padding_masks (torch.Tensor): True on response positions after the first stop token, ``[b, r]``.
        value_padding_masks (torch.Tensor): True where ``values`` are padding, ``[b, r]``.
        value_seq_idxs (torch.Tensor): the response position that receives the score, ``[b]`` (torchtune's recipe:
            one past the last response token; tune's: the last response token).
        scores (torch.Tensor): the reward model's score of each (prompt, response), after penalties, ``[b]``.
        seq_lens (torch.Tensor): the length of each truncated response, ``[b]`` (tune's recipe: tokens up to and
            including the first stop token).
    """

    query_responses: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    masks: torch.Tensor
    position_ids: torch.Tensor
    response_padding_masks: torch.Tensor
    value_padding_masks: torch.Tensor
    value_seq_idxs: torch.Tensor
    scores: torch.Tensor
    seq_lens: torch.Tensor


class PPOStats(NamedTuple):
    """Statistics of PPO updates (torchtune's field names and meanings).

    Attributes:
        loss (torch.Tensor): the total loss (policy loss plus the weighted value loss).
        policy_loss (torch.Tensor): the clipped surrogate policy loss.
        value_loss (torch.Tensor): the clipped value loss.
        ratios (torch.Tensor): mean ratio of the current to the generating policy's token probabilities.
        clipfrac (torch.Tensor): fraction of tokens whose ratio was clipped.
        approx_policy_kls (torch.Tensor): ``0.5 * mean((logp_new - logp_old)^2)``, a KL estimate between the policy
            that generated the batch and the one being optimised.
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    ratios: torch.Tensor
    clipfrac: torch.Tensor
    approx_policy_kls: torch.Tensor


def get_rewards_ppo(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kl_coeff: float,
    valid_score_idxs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO rewards: a KL penalty towards the reference at every token, plus the score at one position.

    ``reward[t] = -kl_coeff * (logprobs[t] - ref_logprobs[t])``, and the sequence's score is added at
    ``valid_score_idxs`` (the last position when None), as in Ziegler et al. 2019 (arXiv:1909.08593), eq. 2.

    Args:
        scores (torch.Tensor): reward-model scores ``[b]``.
        logprobs (torch.Tensor): policy log-probabilities of the response tokens ``[b, r]``.
        ref_logprobs (torch.Tensor): reference log-probabilities ``[b, r]``.
        kl_coeff (float): weight of the KL penalty.
        valid_score_idxs (torch.Tensor | None): ``[b]`` response position receiving each score. Default None.

    Returns:
        tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ``(total_reward, kl, kl_reward)``, each ``[b, r]``:
        the rewards, the per-token log-ratio ``logprobs - ref_logprobs``, and ``-kl_coeff * kl``.
    """
    kl = logprobs - ref_logprobs
    kl_reward = -kl_coeff * kl
    if valid_score_idxs is None:
        valid_score_idxs = torch.full_like(scores, kl.shape[-1] - 1, dtype=torch.long)
    score_per_token = torch.zeros_like(kl_reward).scatter_add(
        1, valid_score_idxs.long().unsqueeze(-1), scores.to(kl_reward.dtype).unsqueeze(-1)
    )
    return kl_reward + score_per_token, kl, kl_reward


def estimate_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
    lmbda: float,
    masks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv:1506.02438, eq. 16) over response tokens.

    With ``delta[t] = rewards[t] + gamma * values[t + 1] - values[t]`` (``values[r] = 0``: the episode ends with
    the response), ``advantage[t] = sum_k (gamma * lmbda)^k delta[t + k]`` and ``return[t] = advantage[t] +
    values[t]``. The advantages are then whitened (over the ``masks`` positions) and set to 0 elsewhere; the
    returns are not. Padding positions should hold zero values and rewards so that they add nothing.

    Args:
        values (torch.Tensor): value estimates ``[b, r]``.
        rewards (torch.Tensor): per-token rewards ``[b, r]``.
        gamma (float): discount factor.
        lmbda (float): GAE's lambda.
        masks (torch.Tensor | None): bool ``[b, r]``, True on the response tokens that count. Default None (all).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``(advantages, returns)``, each ``[b, r]``.
    """
    response_len = values.shape[-1]
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    # backwards through the response: A[t] = delta[t] + gamma * lmbda * A[t + 1]
    for t in range(response_len - 1, -1, -1):
        next_value = values[:, t + 1] if t + 1 < response_len else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lmbda * running
        advantages[:, t] = running
    returns = advantages + values
    advantages = whiten(advantages, mask=masks)
    if masks is not None:
        advantages = advantages.masked_fill(~masks, 0.0)
    return advantages, returns
