"""Odds Ratio Preference Optimization (ORPO): a reference-free preference loss added to the chosen sequences' NLL.

ORPO trains in one stage what SFT then DPO train in two: the negative log-likelihood of the chosen sequences plus a
term that raises the odds of the chosen completion over the rejected one. This module holds the odds-ratio term;
the recipes add the NLL (a loss with ``chosen_nll = True`` asks for it; see ``tune.rlhf.chosen_nll_labels``).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

# log(1/2): where log(1 - exp(x)) switches between its two accurate forms
_LOG_HALF = -math.log(2.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate over the whole range (Maechler, 2012, "Accurately computing
    log(1 - exp(-|a|))"): ``log(-expm1(x))`` near 0, ``log1p(-exp(x))`` below ``log(1/2)``.

    ``x`` is clamped below ``-tiny`` (the smallest normal number of its dtype): a log-probability that rounded to
    0 (a probability of 1) gives a large finite value instead of ``-inf``. Each branch sees only its own range, so
    the gradient of the branch not taken is never ``0 * inf``.

    Args:
        x (torch.Tensor): log-probabilities (``<= 0``), any shape; computed in float32 at least.

    Returns:
        torch.Tensor: ``log(1 - exp(x))``, same shape.
    """
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    x = x.clamp(max=-torch.finfo(x.dtype).tiny)
    near_zero = torch.log(-torch.expm1(x.clamp(min=_LOG_HALF)))
    far = torch.log1p(-torch.exp(x.clamp(max=_LOG_HALF)))
    return torch.where(x < _LOG_HALF, far, near_zero)


class ORPOLoss(nn.Module):
    """The odds-ratio term of ORPO (Hong et al., 2024, https://arxiv.org/abs/2403.07691, Eqs. 4-7): reference-free.

    With ``a_c`` and ``a_r`` the policy's mean log-probabilities per completion token of the chosen and the
    rejected completions, the odds of a completion are ``p / (1 - p)`` with ``p = exp(a)``, and the log odds ratio
    is ``z = (a_c - a_r) - (log(1 - exp(a_c)) - log(1 - exp(a_r)))``. The per-pair loss is
    ``-beta * log sigmoid(z)``; the rewards are ``beta * a_c`` and ``beta * a_r`` (as TRL reports them).

    ORPO's full objective is this term averaged over the pairs plus the negative log-likelihood of the chosen
    sequences (prompt and completion), which the training loop adds: ``chosen_nll = True`` asks the recipes for it
    (they average it over every chosen token of the optimizer step, on all ranks). Pass mean log-probabilities
    (``average_log_probs`` is True); no reference model is used (``reference_free`` is True).

    Args:
        beta (float): the weight of the odds-ratio term against the NLL (the paper's lambda); 0.1 in the paper
            and TRL. Default 0.1.

    Raises:
        ValueError: for ``beta <= 0``.
    """

    reference_free = True
    average_log_probs = True
    chosen_nll = True

    def __init__(self, beta: float = 0.1) -> None:
        super().__init__()
        if beta <= 0:
            raise ValueError(f"beta (the weight of the odds-ratio term) must be > 0; got {beta}.")
        self.beta = beta

    @staticmethod
    def log_odds(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor) -> torch.Tensor:
        """The log odds ratio ``z`` of each pair (see the class docstring), in float32 at least.

        Args:
            policy_chosen_logps (torch.Tensor): ``[b]`` mean log-probability per token of the chosen completions.
            policy_rejected_logps (torch.Tensor): ``[b]``, of the rejected completions.

        Returns:
            torch.Tensor: ``[b]`` log odds ratios, attached to the graph.
        """
        chosen = policy_chosen_logps.to(torch.promote_types(policy_chosen_logps.dtype, torch.float32))
        rejected = policy_rejected_logps.to(chosen.dtype)
        return (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))

    def forward(
        self, policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The odds-ratio loss of each pair (without the NLL, which the caller adds).

        Args:
            policy_chosen_logps (torch.Tensor): ``[b]`` mean log-probability per token of the chosen completions.
            policy_rejected_logps (torch.Tensor): ``[b]``, of the rejected completions.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ``(losses, chosen_rewards, rejected_rewards)``, ``[b]``
            each; the rewards are detached.
        """
        losses = -self.beta * F.logsigmoid(self.log_odds(policy_chosen_logps, policy_rejected_logps))
        return (
            losses,
            self.beta * policy_chosen_logps.detach().to(losses.dtype),
            self.beta * policy_rejected_logps.detach().to(losses.dtype),
        )
