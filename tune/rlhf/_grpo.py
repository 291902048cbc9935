"""Group Relative Policy Optimization (GRPO; Shao et al., 2024, https://arxiv.org/abs/2402.03300): the
group-normalised advantages, the completion mask cut at the first stop token, and the per-token log-probabilities
of sampled completions.

A GRPO step samples ``group_size`` completions of each prompt; the advantage of a completion is its reward
relative to the other completions of the same prompt, so no value model is needed.
"""

import torch

ADVANTAGE_EPS = 1e-4  # added to the group's standard deviation (GRPO paper, TRL and torchtune use the same)


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """Group-normalised advantages: ``(r - mean_g(r)) / (std_g(r) + eps)`` within each prompt's group.

    ``std_g`` is Bessel-corrected (divides by ``group_size - 1``), as ``torch.std`` and TRL's ``GRPOTrainer``
    (``scale_rewards="group"``) compute it. A group whose completions all got the same reward has advantages 0:
    it gives no learning signal.

    Args:
        rewards (torch.Tensor): ``[num_prompts * group_size]`` rewards, the completions of a prompt consecutive
            (as ``prompts.repeat_interleave(group_size)`` orders them), or ``[num_prompts, group_size]``.
        group_size (int): completions per prompt, at least 2 (one completion has no group to compare with).
        eps (float): added to the standard deviation. Default 1e-4.

    Returns:
        torch.Tensor: advantages shaped like ``rewards``, in float32 or ``rewards``' floating dtype.

    Raises:
        ValueError: if ``group_size < 2`` or ``rewards`` do not split into groups of ``group_size``.
    """
    if group_size < 2:
        raise ValueError(
            f"group_size must be at least 2 (the advantage compares a group's completions), got {group_size}"
        )
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of group_size={group_size}")
    values = rewards if rewards.is_floating_point() else rewards.float()
    grouped = values.reshape(-1, group_size)  # [num_prompts, group_size]
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)  # unbiased: / (group_size - 1)
    return ((grouped - mean) / (std + eps)).reshape(rewards.shape)


def completion_mask(completions: torch.Tensor, stop_tokens: torch.Tensor | list[int]) -> torch.Tensor:
    """Which generated tokens belong to each completion: everything up to and including the first stop token.

    The stop token (EOS, end of turn) is part of the completion: the policy learns to end its answer, as in TRL.
    Whatever follows it (padding, or tokens generated after the row stopped) is masked out.

    Args:
        completions (torch.Tensor): ``[b, t]`` generated token ids.
        stop_tokens (torch.Tensor | list[int]): the ids that end a completion.

    Returns:
        torch.Tensor: ``[b, t]`` bool, True on the completion's tokens.
    """
    stops = torch.as_tensor(stop_tokens, dtype=completions.dtype, device=completions.device)
    is_stop = torch.isin(completions, stops).int()
    stops_before = is_stop.cumsum(dim=1) - is_stop  # stop tokens strictly before each position
    return stops_before == 0


def completion_log_probs(logits: torch.Tensor, completions: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probabilities of sampled completions under ``softmax(logits / temperature)``, the
    distribution they were sampled from (TRL and torchtune divide by the sampling temperature the same way).

    Args:
        logits (torch.Tensor): ``[b, t, vocab]``, position ``i`` predicting ``completions[:, i]`` (for a model run
            on ``prompt + completion`` of prompt length ``p``: ``logits[:, p - 1 : -1]``).
        completions (torch.Tensor): ``[b, t]`` token ids.
        temperature (float): the sampling temperature; 0 (greedy) or 1 leaves the logits as they are. Default 1.0.

    Returns:
        torch.Tensor: ``[b, t]`` float32 log-probabilities.
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, 2, completions.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
