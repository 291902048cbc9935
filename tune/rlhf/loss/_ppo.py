"""The clipped PPO objective for a policy and its value model (Schulman et al. 2017, arXiv:1707.06347)."""

import torch
from torch import nn

from tune.rlhf._stats import masked_mean


def _mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x.mean() if mask is None else masked_mean(x, mask)


class PPOLoss(nn.Module):
    """The PPO loss: clipped surrogate policy loss plus ``value_coeff`` times the clipped value loss.

    With ``ratio = exp(pi_logprobs - pi_old_logprobs)`` and advantages ``A``, the policy loss is the mean of
    ``max(-A * ratio, -A * clip(ratio, 1 - epsilon, 1 + epsilon))`` (eq. 7 of the paper, negated). With values
    ``V``, old values ``V_old`` and returns ``R``, the value loss is ``0.5 * mean(max((V - R)^2, (V_c - R)^2))``
    where ``V_c = clip(V, V_old - value_clip_range, V_old + value_clip_range)`` (OpenAI baselines' ppo2). Means are
    over the masked positions when masks are given.

    Args:
        epsilon (float): clipping range of the probability ratio. Default 0.1.
        value_clip_range (float): how far the value may move from the old value before clipping. Default 0.2.
        value_coeff (float): weight of the value loss in the total. Default 0.1.
    """

    def __init__(self, epsilon: float = 0.1, value_clip_range: float = 0.2, value_coeff: float = 0.1) -> None:
        super().__init__()
        self.epsilon = epsilon
        self.value_clip_range = value_clip_range
        self.value_coeff = value_coeff

    def forward(
        self,
        pi_old_logprobs: torch.Tensor,
        pi_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        phi_old_values: torch.Tensor,
        phi_values: torch.Tensor,
        returns: torch.Tensor,
        padding_masks: torch.Tensor | None = None,
        value_padding_masks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss of one batch of response tokens (all tensors ``[b, r]``).

        Args:
            pi_old_logprobs (torch.Tensor): log-probabilities under the policy that generated the tokens.
            pi_logprobs (torch.Tensor): log-probabilities under the policy being optimised.
            advantages (torch.Tensor): advantage estimates.
            phi_old_values (torch.Tensor): values predicted when the tokens were generated.
            phi_values (torch.Tensor): values predicted by the value model being optimised.
            returns (torch.Tensor): value targets.
            padding_masks (torch.Tensor | None): bool, True where a token counts in the policy loss. Default None.
            value_padding_masks (torch.Tensor | None): bool, True where a value counts in the value loss.
                Default None.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]: ``(loss, policy_loss,
            value_loss, ratios, clipfrac)``: the total loss (with gradient) and, detached, the policy loss, the
            value loss, the mean ratio (over every position) and the fraction of clipped tokens.
        """
        ratios = torch.exp(pi_logprobs - pi_old_logprobs)
        unclipped = -advantages * ratios
        clipped = -advantages * ratios.clamp(1.0 - self.epsilon, 1.0 + self.epsilon)
        policy_loss = _mean(torch.maximum(unclipped, clipped), padding_masks)
        clipfrac = _mean((clipped > unclipped).to(pi_logprobs.dtype), padding_masks)

        values_clipped = torch.clamp(
            phi_values, phi_old_values - self.value_clip_range, phi_old_values + self.value_clip_range
        )
        value_errors = torch.maximum((phi_values - returns).pow(2), (values_clipped - returns).pow(2))
        value_loss = 0.5 * _mean(value_errors, value_padding_masks)

        loss = policy_loss + self.value_coeff * value_loss
        return loss, policy_loss.detach(), value_loss.detach(), ratios.mean().detach(), clipfrac.detach()
