"""Token-choice top-k routing with a softmax gate (Shazeer et al., 2017, https://arxiv.org/abs/1701.06538)."""

import torch
import torch.nn.functional as F
from torch import nn


class TopKRouter(nn.Module):
    """Scores every token against every expert and keeps the ``experts_per_token`` best.

    ``probs = softmax(gate(x))`` in float32; the top-k probabilities are the mixing weights of the chosen experts,
    renormalised to sum to 1 per token when ``norm_topk_prob`` is set (Qwen3-MoE's ``norm_topk_prob: true``;
    Qwen1.5-MoE keeps them as they are). The weights are returned in the input's dtype.

    With ``score_func="sigmoid"`` the k largest logits are chosen and their weights are ``sigmoid(logit)`` in
    float32, each in ``(0, 1)`` independently of the other experts (Llama 4's router, with ``norm_topk_prob``
    False). The load-balancing loss reads the logits through a softmax either way.

    Args:
        gate (nn.Module): ``dim -> num_experts`` projection without bias (an ``nn.Linear``, or a LoRA layer when
            the router is adapted); stored as ``gate``.
        num_experts (int): experts to choose from.
        experts_per_token (int): experts each token is sent to (k).
        norm_topk_prob (bool): renormalise the k weights to sum to 1. Default True.
        score_func (str): ``"softmax"`` (over all experts) or ``"sigmoid"`` (of each chosen logit). Default
            ``"softmax"``.

    Raises:
        ValueError: if ``experts_per_token`` is not in ``[1, num_experts]`` or ``score_func`` is unknown.
    """

    def __init__(
        self,
        gate: nn.Module,
        num_experts: int,
        experts_per_token: int,
        norm_topk_prob: bool = True,
        score_func: str = "softmax",
    ) -> None:
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {score_func!r}.")
        if not 1 <= experts_per_token <= num_experts:
            raise ValueError(
                f"experts_per_token must be between 1 and num_experts ({num_experts}), got {experts_per_token}."
            )
        self.gate = gate
        self.num_experts = num_experts
        self.experts_per_token = experts_per_token
        self.norm_topk_prob = norm_topk_prob
        self.score_func = score_func

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Routes the tokens.

        Args:
            x (torch.Tensor): ``[num_tokens, dim]``.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: the router logits ``[num_tokens, num_experts]`` (input
            dtype; what the load-balancing loss reads), the mixing weights ``[num_tokens, k]`` (input dtype) and
            the chosen experts' indices ``[num_tokens, k]`` (int64), best first.
        """
        logits = self.gate(x)
        if self.score_func == "sigmoid":
            # sigmoid is increasing, so the top-k logits are the top-k scores; choosing on the logits avoids the ties
            # of sigmoid saturating to 1.0 in float32
            top, indices = torch.topk(logits, self.experts_per_token, dim=-1)
            weights = torch.sigmoid(top.float())
        else:
            probs = F.softmax(logits, dim=-1, dtype=torch.float32)
            weights, indices = torch.topk(probs, self.experts_per_token, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(x.dtype), indices

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, experts_per_token={self.experts_per_token}, "
            f"norm_topk_prob={self.norm_topk_prob}, score_func={self.score_func!r}"
        )
