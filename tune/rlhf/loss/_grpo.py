"""The GRPO policy loss: a clipped importance-weighted objective against the policy that sampled the completions,
with an optional KL penalty to a reference model, normalised in one of three ways.
"""

from typing import NamedTuple

import torch
from torch import nn

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")


class GRPOLossOutput(NamedTuple):
    """What :class:`GRPOLoss` returns.

    Attributes:
        loss (torch.Tensor): the scalar to backpropagate (policy term plus ``beta`` times the KL term).
        policy_loss (torch.Tensor): the clipped policy term alone, normalised like ``loss``; detached.
        kl_loss (torch.Tensor): the KL term alone (before ``beta``), normalised like ``loss``; detached; 0 when
            ``beta == 0``.
        num_clipped (torch.Tensor): completion tokens whose ratio the clip bound (the ratio left the trust region
            in the direction the advantage pushes); detached, summed over the batch.
        kl_sum (torch.Tensor): the per-token k3 KL summed over the completion tokens; detached; 0 when
            ``beta == 0``.
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl_loss: torch.Tensor
    num_clipped: torch.Tensor
    kl_sum: torch.Tensor


class GRPOLoss(nn.Module):
    """The GRPO objective (Shao et al., 2024, https://arxiv.org/abs/2402.03300, Eq. 3) over completion tokens.

    Per token, with ``ratio = exp(logp - old_logp)`` the probability of the token under the policy being
    trained over the policy that sampled it, and ``A`` the completion's advantage::

        per_token = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * kl

    where ``kl = exp(ref - logp) - (ref - logp) - 1`` is the k3 estimator of ``KL(policy || reference)``
    (Schulman, 2020, http://joschu.net/blog/kl-approx.html). The clipped ratio is what keeps a batch that is
    optimised more than once (``ppo_epochs > 1``) inside the trust region around the sampling policy; on the first
    pass over a batch the data is on-policy (``logp == old_logp``), the ratio is exactly 1 and nothing is clipped.
    torchtune's ``GRPOSimpleLoss`` (``torchtune.dev.grpo.loss``) has no old policy (its ratio is 1 by
    construction), so with more than one PPO epoch it has no trust region; this loss keeps one.

    ``loss_type`` chooses how the per-token terms are averaged, as TRL 1.16's ``GRPOTrainer`` does:

    - ``"grpo"``: the mean over each completion's tokens, then the mean over completions (the paper's 1/|o_i|);
    - ``"bnpo"`` (also ``"dapo"``, DAPO, Yu et al., 2025, https://arxiv.org/abs/2503.14476): the sum over every
      completion token of the batch over their number, so long completions weigh more;
    - ``"dr_grpo"`` (Dr. GRPO, Liu et al., 2025, https://arxiv.org/abs/2503.20783): the sum over every completion
      token over ``num_sequences * max_completion_length``, a constant that removes the length bias.

    A step optimised over several micro-batches passes the totals of the whole step (``num_sequences``,
    ``num_tokens``) so that the micro-batch losses add up to the loss of the whole batch (the gradient does not
    depend on how the batch is split). Given none, the loss is that of this batch alone, as TRL computes it (TRL's
    ``dapo`` divides by the completion tokens of its generation batch: pass that count as ``num_tokens``).

    Args:
        epsilon (float): the lower clip, the ratio's floor is ``1 - epsilon``. Default 0.2.
        epsilon_high (float | None): the upper clip, ``1 + epsilon_high`` (DAPO's "clip higher"); None: ``epsilon``.
            Default None.
        beta (float): the KL coefficient; 0 (the default) leaves the reference out (no reference model needed).
            torchtune's dev GRPO losses call it ``kl_coeff``.
        loss_type (str): ``"grpo"``, ``"bnpo"``, ``"dapo"`` (the same as ``"bnpo"`` here) or ``"dr_grpo"``.
            Default ``"grpo"``.
        max_completion_length (int | None): the ``dr_grpo`` denominator's length (the run's
            ``max_generated_tokens``); None: the width of the batch's completions. Default None.

    Raises:
        ValueError: for an unknown ``loss_type``, a negative ``beta``, ``epsilon`` outside ``[0, 1)`` or a
            negative ``epsilon_high``.
    """

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        loss_type: str = "grpo",
        max_completion_length: int | None = None,
    ) -> None:
        super().__init__()
        if loss_type not in GRPO_LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(GRPO_LOSS_TYPES)}; got {loss_type!r}")
        if not 0 <= epsilon < 1:
            raise ValueError(f"epsilon must be in [0, 1) (the ratio's floor is 1 - epsilon); got {epsilon}")
        if epsilon_high is not None and epsilon_high < 0:
            raise ValueError(f"epsilon_high must be >= 0, or null for epsilon; got {epsilon_high}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0 (0 turns the KL penalty off); got {beta}")
        if max_completion_length is not None and max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, or null; got {max_completion_length}")
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.beta = beta
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length

    @property
    def needs_reference(self) -> bool:
        """Whether ``forward`` needs the reference model's log-probabilities (``beta > 0``)."""
        return self.beta > 0

    def forward(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        *,
        num_sequences: int | torch.Tensor | None = None,
        num_tokens: int | torch.Tensor | None = None,
    ) -> GRPOLossOutput:
        """The loss of a batch of completions.

        Args:
            logprobs (torch.Tensor): ``[b, t]`` per-token log-probabilities under the policy being trained.
            old_logprobs (torch.Tensor): ``[b, t]`` the same under the policy that sampled the completions.
            advantages (torch.Tensor): ``[b]`` one per completion (:func:`tune.rlhf.grpo_advantages`).
            mask (torch.Tensor): ``[b, t]`` bool, True on completion tokens (:func:`tune.rlhf.completion_mask`).
            ref_logprobs (torch.Tensor | None): ``[b, t]`` under the reference model; needed when ``beta > 0``.
            num_sequences (int | torch.Tensor | None): completions of the whole step (``grpo``, ``dr_grpo``);
                None: ``b``.
            num_tokens (int | torch.Tensor | None): completion tokens of the whole step (``bnpo``); None: this
                batch's.

        Returns:
            GRPOLossOutput: the loss and what to log.

        Raises:
            ValueError: if ``beta > 0`` and ``ref_logprobs`` is None.
        """
        if self.beta > 0 and ref_logprobs is None:
            raise ValueError("GRPOLoss(beta > 0) needs ref_logprobs: run the reference model, or set beta: 0")
        mask = mask.to(logprobs.dtype)
        advantages = advantages.to(logprobs.dtype).unsqueeze(1)  # [b, 1]: one per completion, for every token
        ratio = torch.exp(logprobs - old_logprobs)
        clipped_ratio = torch.clamp(ratio, 1 - self.epsilon, 1 + self.epsilon_high)
        policy = -torch.min(ratio * advantages, clipped_ratio * advantages)  # [b, t]
        per_token = policy
        kl = None
        if self.beta > 0:
            delta = ref_logprobs - logprobs
            kl = torch.exp(delta) - delta - 1  # k3: >= 0, unbiased for KL(policy || reference) under the policy
            per_token = policy + self.beta * kl
        with torch.no_grad():
            clipped = ((ratio < 1 - self.epsilon) & (advantages < 0)) | (
                (ratio > 1 + self.epsilon_high) & (advantages > 0)
            )
            num_clipped = (clipped.to(mask.dtype) * mask).sum()
            kl_sum = (kl * mask).sum() if kl is not None else logprobs.new_zeros(())
            policy_loss = self._reduce(policy, mask, num_sequences, num_tokens)
            kl_loss = self._reduce(kl, mask, num_sequences, num_tokens) if kl is not None else logprobs.new_zeros(())
        loss = self._reduce(per_token, mask, num_sequences, num_tokens)
        return GRPOLossOutput(loss, policy_loss, kl_loss, num_clipped, kl_sum)

    def _reduce(
        self,
        per_token: torch.Tensor,
        mask: torch.Tensor,
        num_sequences: int | torch.Tensor | None,
        num_tokens: int | torch.Tensor | None,
    ) -> torch.Tensor:
        if self.loss_type == "grpo":
            per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            return per_sequence.mean() if num_sequences is None else per_sequence.sum() / num_sequences
        if self.loss_type in ("bnpo", "dapo"):
            tokens = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, device=mask.device)
            return (per_token * mask).sum() / tokens.clamp(min=1.0)
        sequences = per_token.shape[0] if num_sequences is None else num_sequences
        length = per_token.shape[1] if self.max_completion_length is None else self.max_completion_length
        return (per_token * mask).sum() / (sequences * length)
