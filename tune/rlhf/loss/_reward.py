"""The Bradley-Terry loss of reward-model training, and the reward metrics logged with it.

A reward model scores a sequence with one number, its reward ``r``; trained on pairs of a chosen and a rejected
response to the same prompt, it learns ``P(chosen preferred) = sigmoid(r_c - r_r)`` (Bradley and Terry, 1952; as a
reward-model objective: Ouyang et al., 2022, https://arxiv.org/abs/2203.02155, Eq. 1).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class RewardModelLoss(nn.Module):
    """Bradley-Terry loss of a reward model on preference pairs: per pair
    ``-log sigmoid(r_c - r_r - margin) + center_rewards_coefficient * (r_c + r_r)^2``.

    ``margin`` (optional, per pair) asks the chosen reward to exceed the rejected one by that much: Llama 2's
    reward models use it for pairs rated far apart (Touvron et al., 2023, https://arxiv.org/abs/2307.09288, Eq. 2).
    The centering term (Eisenstein et al., 2023, https://arxiv.org/abs/2312.09244) pulls the rewards towards
    mean zero. The mean over pairs of these losses is TRL's ``RewardTrainer`` loss (``margin`` from the dataset's
    ``margin`` column; ``center_rewards_coefficient`` of ``RewardConfig``).

    Reduction: ``forward`` returns the per-pair losses ``[b]``; the caller averages them over the pairs of a step
    (``reduction = "none"``).

    Args:
        center_rewards_coefficient (float | None): weight of the centering term; None (or 0) leaves it out.
            Default None.

    Raises:
        ValueError: for a negative ``center_rewards_coefficient``.
    """

    reduction = "none"

    def __init__(self, center_rewards_coefficient: float | None = None) -> None:
        super().__init__()
        if center_rewards_coefficient is not None and center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0 or null, got {center_rewards_coefficient}.")
        self.center_rewards_coefficient = center_rewards_coefficient

    def forward(
        self, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-pair losses.

        Args:
            chosen_rewards (torch.Tensor): ``[b]`` rewards of the chosen sequences.
            rejected_rewards (torch.Tensor): ``[b]`` rewards of the rejected sequences, pair by pair.
            margin (torch.Tensor | None): ``[b]`` margins the chosen rewards should win by; None for 0.

        Returns:
            torch.Tensor: ``[b]`` float32 losses.
        """
        chosen, rejected = chosen_rewards.float(), rejected_rewards.float()
        difference = chosen - rejected
        if margin is not None:
            difference = difference - margin.to(difference)
        losses = -F.logsigmoid(difference)
        if self.center_rewards_coefficient:
            losses = losses + self.center_rewards_coefficient * (chosen + rejected) ** 2
        return losses


class RewardMetrics:
    """Reward metrics of the pairs seen since the last :meth:`compute`, under TRL's ``RewardTrainer`` names.

    ``accuracy`` (share of pairs whose chosen reward is the higher), ``margin`` (mean ``r_c - r_r``) and
    ``mean_reward`` (over every sequence) are means over all the pairs since the last call; ``min_reward`` and
    ``max_reward`` the extremes over them (TRL averages each logged batch's extremes instead). Updates stay on the
    device; :meth:`compute` reads them (a host-device sync: call it at logging steps).

    Args:
        device (torch.device): where the running sums live.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._reset()

    def _reset(self) -> None:
        # correct pairs, summed margins, summed rewards, pairs, min, max
        self._sums = torch.zeros(4, dtype=torch.float64, device=self._device)
        self._extremes = torch.tensor([float("inf"), float("-inf")], dtype=torch.float64, device=self._device)

    @torch.no_grad()
    def update(self, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> None:
        """Adds the rewards ``[b]`` of a micro-batch of pairs."""
        chosen, rejected = chosen_rewards.detach().double(), rejected_rewards.detach().double()
        both = torch.cat([chosen, rejected])
        self._sums += torch.stack(
            [
                (chosen > rejected).sum().double(),
                (chosen - rejected).sum(),
                both.sum() / 2,
                both.new_tensor(len(chosen)),
            ]
        )
        self._extremes = torch.stack(
            [torch.minimum(self._extremes[0], both.min()), torch.maximum(self._extremes[1], both.max())]
        )

    def compute(
        self,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """The metrics since the last call (empty when no pair was seen), then starts over.

        Args:
            all_reduce (Callable | None): sums a tensor over data-parallel ranks (distributed recipes).
            all_reduce_max (Callable | None): its elementwise maximum over the ranks, for the extremes; needed with
                ``all_reduce``.

        Returns:
            dict[str, float]: the metrics over the pairs of every rank.
        """
        sums, extremes = self._sums, torch.stack([-self._extremes[0], self._extremes[1]])
        if all_reduce is not None:
            sums, extremes = all_reduce(sums), all_reduce_max(extremes)
        correct, margins, rewards, pairs = sums.tolist()
        negated_low, high = extremes.tolist()
        low = -negated_low
        self._reset()
        if not pairs:
            return {}
        return {
            "accuracy": correct / pairs,
            "margin": margins / pairs,
            "min_reward": low,
            "mean_reward": rewards / pairs,  # sum over 2 * pairs sequences, halved above
            "max_reward": high,
        }
