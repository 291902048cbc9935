"""Preference losses over sequence log-probabilities: DPO and its variants (sigmoid, hinge, IPO, robust), RSO and
the reference-free SimPO.

Every loss takes the policy's log-probabilities of the chosen and the rejected completion of each pair (and,
but for SimPO, the reference model's), ``[b]`` each, and returns ``(losses, chosen_rewards, rejected_rewards)``:
the per-pair losses ``[b]`` (the caller averages them) and the implicit rewards ``[b]``, detached.

Two attributes tell a training loop what a loss needs (the recipes read them; a user's loss may set them too):

- ``average_log_probs``: the sequence log-probabilities must be means over the completion tokens instead of
  sums (IPO, SimPO);
- ``reference_free``: no reference model is needed; ``forward`` takes the policy's log-probabilities only.

Notation: ``z = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))``, the margin of the policy over
the reference between the chosen ``y_c`` and the rejected ``y_r`` completion.
"""

import warnings

import torch
import torch.nn.functional as F
from torch import nn

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "robust")


def _rewards(scale: float, policy_logps: torch.Tensor, reference_logps: torch.Tensor | None = None) -> torch.Tensor:
    """``scale * (policy - reference)`` log-probabilities, detached: the implicit reward of DPO-style losses."""
    difference = policy_logps if reference_logps is None else policy_logps - reference_logps
    return scale * difference.detach()


def _smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Binary cross-entropy of ``sigmoid(logits)`` against the soft target ``1 - label_smoothing``."""
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


class DPOLoss(nn.Module):
    """Direct Preference Optimization (Rafailov et al., 2023, https://arxiv.org/abs/2305.18290) and variants.

    With ``z`` the policy's margin over the reference (see the module docstring) and ``eps = label_smoothing``,
    the per-pair loss of each ``loss_type`` is:

    - ``"sigmoid"`` (DPO): ``-(1 - eps) * log sigmoid(beta * z) - eps * log sigmoid(-beta * z)``. With ``eps > 0``
      this is *conservative DPO* (Mitchell, 2023, "A note on DPO with noisy preferences"): each preference label is
      assumed flipped with probability ``eps``, so the loss is the binary cross-entropy of ``sigmoid(beta * z)``
      against the soft target ``1 - eps``. It is minimal at ``beta * z = log((1 - eps) / eps)``, so it stops
      widening the margin there, where plain DPO (``eps = 0``) pushes ``z`` to infinity.
    - ``"hinge"`` (SLiC / RSO, Liu et al., 2023, https://arxiv.org/abs/2309.06657): ``relu(1 - beta * z)``.
    - ``"ipo"`` (Azar et al., 2023, https://arxiv.org/abs/2310.12036, Eq. 17): ``(z - 1 / (2 * beta))^2``, with ``z``
      computed from length-normalised log-probabilities (means over the completion tokens, as TRL does): pass
      means, which the recipes do when ``average_log_probs`` is True.
    - ``"robust"`` (rDPO, Chowdhury et al., 2024, https://arxiv.org/abs/2403.00409, Eq. 8): an unbiased estimate of
      the DPO loss under labels flipped with probability ``eps``:
      ``((1 - eps) * -log sigmoid(beta * z) - eps * -log sigmoid(-beta * z)) / (1 - 2 * eps)``; needs
      ``0 <= eps < 0.5``.

    The rewards are ``beta * (log pi(y) - log pi_ref(y))`` of the log-probabilities given (means for IPO).

    Args:
        beta (float): the inverse temperature (DPO's beta, IPO's tau), typically 0.1 to 0.5. Default 0.1.
        label_smoothing (float): the assumed probability ``eps`` that a preference label is flipped (``"sigmoid"``
            and ``"robust"``; no effect on ``"hinge"`` and ``"ipo"``). Default 0.0.
        loss_type (str): one of ``"sigmoid"``, ``"hinge"``, ``"ipo"``, ``"robust"``. Default ``"sigmoid"``.

    Raises:
        ValueError: for an unknown ``loss_type``, ``beta <= 0``, or ``label_smoothing`` outside ``[0, 1]``
            (``[0, 0.5)`` for ``"robust"``).
    """

    reference_free = False

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0, loss_type: str = "sigmoid") -> None:
        super().__init__()
        if loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(DPO_LOSS_TYPES)}; got {loss_type!r}.")
        if beta <= 0:
            raise ValueError(f"beta must be > 0; got {beta}.")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(
                f"label_smoothing (the probability that a preference label is flipped) must be in [0, 1]; got "
                f"{label_smoothing}."
            )
        if loss_type == "robust" and label_smoothing >= 0.5:
            raise ValueError(
                f"loss_type='robust' needs label_smoothing < 0.5 (it divides by 1 - 2 * label_smoothing); got "
                f"{label_smoothing}."
            )
        if label_smoothing and loss_type in ("hinge", "ipo"):
            warnings.warn(f"label_smoothing has no effect with loss_type={loss_type!r}.", stacklevel=2)
        self.beta = beta
        self.label_smoothing = label_smoothing
        self.loss_type = loss_type

    @property
    def average_log_probs(self) -> bool:
        """Whether the sequence log-probabilities must be means over the completion tokens (IPO)."""
        return self.loss_type == "ipo"

    def forward(
        self,
        policy_chosen_logps: torch.Tensor,
        policy_rejected_logps: torch.Tensor,
        reference_chosen_logps: torch.Tensor,
        reference_rejected_logps: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss of each pair.

        Args:
            policy_chosen_logps (torch.Tensor): ``[b]`` log-probabilities of the chosen completions under the policy.
            policy_rejected_logps (torch.Tensor): ``[b]``, the rejected completions under the policy.
            reference_chosen_logps (torch.Tensor): ``[b]``, the chosen completions under the reference model.
            reference_rejected_logps (torch.Tensor): ``[b]``, the rejected completions under the reference model.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ``(losses, chosen_rewards, rejected_rewards)``, ``[b]``
            each; the rewards are detached.
        """
        margin = (policy_chosen_logps - reference_chosen_logps) - (policy_rejected_logps - reference_rejected_logps)
        logits = self.beta * margin
        eps = self.label_smoothing
        if self.loss_type == "sigmoid":
            losses = _smoothed_sigmoid_loss(logits, eps)
        elif self.loss_type == "hinge":
            losses = torch.relu(1 - logits)
        elif self.loss_type == "ipo":
            losses = (margin - 1 / (2 * self.beta)) ** 2
        else:  # robust: the clean loss minus the flipped one, rescaled so that its expectation is the clean loss
            losses = ((1 - eps) * -F.logsigmoid(logits) - eps * -F.logsigmoid(-logits)) / (1 - 2 * eps)
        return (
            losses,
            _rewards(self.beta, policy_chosen_logps, reference_chosen_logps),
            _rewards(self.beta, policy_rejected_logps, reference_rejected_logps),
        )


class RSOLoss(nn.Module):
    """The hinge loss of Statistical Rejection Sampling Optimization (Liu et al., 2023,
    https://arxiv.org/abs/2309.06657): ``relu(1 - gamma * z)`` per pair, the SVM counterpart of DPO's logistic loss.

    The same as ``DPOLoss(beta=gamma, loss_type="hinge")``.

    Args:
        gamma (float): the inverse temperature (DPO's beta). Default 0.1.
    """

    reference_free = False
    average_log_probs = False

    def __init__(self, gamma: float = 0.1) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(
        self,
        policy_chosen_logps: torch.Tensor,
        policy_rejected_logps: torch.Tensor,
        reference_chosen_logps: torch.Tensor,
        reference_rejected_logps: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss of each pair; arguments and returns as :meth:`DPOLoss.forward`."""
        margin = (policy_chosen_logps - reference_chosen_logps) - (policy_rejected_logps - reference_rejected_logps)
        return (
            torch.relu(1 - self.gamma * margin),
            _rewards(self.gamma, policy_chosen_logps, reference_chosen_logps),
            _rewards(self.gamma, policy_rejected_logps, reference_rejected_logps),
        )


class SimPOLoss(nn.Module):
    """Simple Preference Optimization (Meng et al., 2024, https://arxiv.org/abs/2405.14734, Eq. 6): reference-free.

    With ``a_c`` and ``a_r`` the policy's mean log-probabilities per completion token of the chosen and rejected
    completions, the per-pair loss is ``-(1 - eps) * log sigmoid(d) - eps * log sigmoid(-d)`` with
    ``d = beta * (a_c - a_r) - gamma`` (``eps = label_smoothing``, 0 in the paper; TRL's CPO trainer has it). The
    rewards are ``beta * a_c`` and ``beta * a_r``. Pass mean log-probabilities (``average_log_probs`` is True).

    Args:
        beta (float): scales the length-normalised reward; the paper uses 2.0 to 2.5. Default 2.0.
        gamma (float): the target reward margin; the paper uses 0.5 to 1.6 (``gamma / beta`` about 0.5).
            Default 0.5.
        label_smoothing (float): the assumed probability that a preference label is flipped, as in
            :class:`DPOLoss`. Default 0.0.

    Raises:
        ValueError: for ``beta <= 0`` or ``label_smoothing`` outside ``[0, 1]``.
    """

    reference_free = True
    average_log_probs = True

    def __init__(self, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0) -> None:
        super().__init__()
        if beta <= 0:
            raise ValueError(f"beta must be > 0; got {beta}.")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1]; got {label_smoothing}.")
        self.beta = beta
        self.gamma = gamma
        self.label_smoothing = label_smoothing

    def forward(
        self, policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss of each pair.

        Args:
            policy_chosen_logps (torch.Tensor): ``[b]`` mean log-probability per token of the chosen completions.
            policy_rejected_logps (torch.Tensor): ``[b]``, of the rejected completions.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ``(losses, chosen_rewards, rejected_rewards)``, ``[b]``
            each; the rewards are detached.
        """
        logits = self.beta * (policy_chosen_logps - policy_rejected_logps) - self.gamma
        return (
            _smoothed_sigmoid_loss(logits, self.label_smoothing),
            _rewards(self.beta, policy_chosen_logps),
            _rewards(self.beta, policy_rejected_logps),
        )
