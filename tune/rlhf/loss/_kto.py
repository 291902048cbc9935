"""Kahneman-Tversky Optimization (KTO) on unpaired feedback: each example is one completion labelled desirable or
undesirable, with no paired alternative (Ethayarajh et al., 2024, https://arxiv.org/abs/2402.01306).

The loss takes per-example sequence log-probabilities (sums over the completion tokens) of the policy and the
reference model, the desirable flags, and the KL estimate ``z0`` of the step (see :func:`kto_kl_estimate`), and
returns the per-example losses with the desirable/undesirable weights applied; the caller averages them over the
examples of the step.
"""

import torch
from torch import nn

KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")


def kto_kl_estimate(kl_log_ratio_sum: torch.Tensor, num_kl_rows: torch.Tensor | int) -> torch.Tensor:
    """The reference point ``z0`` of KTO: the mean over the KL rows (mismatched prompt-completion pairs) of the
    policy's minus the reference's summed log-probabilities, detached and clamped at 0 (Eq. 7 of the paper uses
    ``max(0, KL)``, estimated as TRL does).

    Args:
        kl_log_ratio_sum (torch.Tensor): 0-d sum over the KL rows of ``log pi(y'|x) - log pi_ref(y'|x)`` (summed
            over the micro-batches, and ranks, of the step).
        num_kl_rows (torch.Tensor | int): how many rows that sum covers.

    Returns:
        torch.Tensor: 0-d float32, ``>= 0``, detached (0 when there is no KL row).
    """
    count = torch.as_tensor(num_kl_rows, dtype=torch.float32, device=kl_log_ratio_sum.device).clamp(min=1.0)
    return (kl_log_ratio_sum.detach().float() / count).clamp(min=0.0)


class KTOLoss(nn.Module):
    """The KTO loss and its unpaired APO-zero variant, per example, as TRL's ``KTOTrainer`` computes them.

    With ``r = log pi(y|x) - log pi_ref(y|x)`` the log-ratio of an example (sums over its completion tokens) and
    ``z0`` the KL estimate of the step:

    - ``"kto"`` (Eq. 7 of the KTO paper): ``desirable_weight * (1 - sigmoid(beta * (r - z0)))`` for a desirable
      example, ``undesirable_weight * (1 - sigmoid(beta * (z0 - r)))`` for an undesirable one.
    - ``"apo_zero_unpaired"`` (the unpaired form of APO-zero, D'Oosterlinck et al., 2024,
      https://arxiv.org/abs/2408.06266, Eq. 7): ``desirable_weight * (1 - sigmoid(beta * r))`` and
      ``undesirable_weight * sigmoid(beta * r)``; no KL estimate (``needs_kl`` is False).

    The rewards are ``beta * r``, detached.

    Args:
        beta (float): the inverse temperature. Default 0.1.
        desirable_weight (float): the weight of a desirable example's loss (lambda_D). Default 1.0.
        undesirable_weight (float): the weight of an undesirable example's loss (lambda_U). Default 1.0.
        loss_type (str): ``"kto"`` or ``"apo_zero_unpaired"``. Default ``"kto"``.

    Raises:
        ValueError: for an unknown ``loss_type``, ``beta <= 0`` or a negative weight.
    """

    reference_free = False
    average_log_probs = False

    def __init__(
        self,
        beta: float = 0.1,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        loss_type: str = "kto",
    ) -> None:
        super().__init__()
        if loss_type not in KTO_LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(KTO_LOSS_TYPES)}; got {loss_type!r}.")
        if beta <= 0:
            raise ValueError(f"beta must be > 0; got {beta}.")
        if desirable_weight < 0 or undesirable_weight < 0:
            raise ValueError(
                f"desirable_weight and undesirable_weight must be >= 0; got {desirable_weight} and "
                f"{undesirable_weight}."
            )
        self.beta = beta
        self.desirable_weight = desirable_weight
        self.undesirable_weight = undesirable_weight
        self.loss_type = loss_type

    @property
    def needs_kl(self) -> bool:
        """Whether the loss uses the KL estimate (a recipe scores the KL rows only then)."""
        return self.loss_type == "kto"

    def forward(
        self,
        policy_log_probs: torch.Tensor,
        reference_log_probs: torch.Tensor,
        desirable: torch.Tensor,
        kl: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The weighted loss of each example.

        Args:
            policy_log_probs (torch.Tensor): ``[b]`` summed log-probabilities of the completions under the policy.
            reference_log_probs (torch.Tensor): ``[b]``, under the reference model.
            desirable (torch.Tensor): ``[b]`` bool, True for a desirable example.
            kl (torch.Tensor | None): 0-d KL estimate of the step (:func:`kto_kl_estimate`); needed by ``"kto"``,
                ignored by ``"apo_zero_unpaired"``.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``(losses, rewards)``, ``[b]`` each; the rewards are detached.

        Raises:
            ValueError: when ``"kto"`` gets no ``kl``.
        """
        desirable = desirable.to(device=policy_log_probs.device, dtype=torch.bool)
        log_ratio = policy_log_probs - reference_log_probs
        scaled = self.beta * log_ratio
        if self.loss_type == "kto":
            if kl is None:
                raise ValueError("KTOLoss(loss_type='kto') needs the KL estimate of the step (kl=...).")
            kl = kl.detach().to(log_ratio)
            desirable_losses = 1 - torch.sigmoid(self.beta * (log_ratio - kl))
            undesirable_losses = 1 - torch.sigmoid(self.beta * (kl - log_ratio))
        else:
            desirable_losses = 1 - torch.sigmoid(scaled)
            undesirable_losses = torch.sigmoid(scaled)
        losses = torch.where(
            desirable,
            self.desirable_weight * desirable_losses,
            self.undesirable_weight * undesirable_losses,
        )
        return losses, scaled.detach()
