"""Group Relative Policy Optimization (GRPO; Shao et al., 2024, https://arxiv.org/abs/2402.03300): the policy every
GRPO recipe shares. The group-normalised advantages, the completion mask cut at the first stop token, the per-token
log-probabilities of sampled completions, the sampling rule (one generator per completion, seeded by the run's
seed, the epoch, the prompt's dataset index and the completion's number), the trajectory type, the decoding of
completions for the rewards, and the logged statistics.

A GRPO step samples ``group_size`` completions of each prompt; the advantage of a completion is its reward
relative to the other completions of the same prompt, so no value model is needed.
"""

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import Dataset

from tune.modules import get_causal_mask_from_padding_mask, get_position_ids_from_padding_mask

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


# the key under which a prompt row carries its index in the dataset (see IndexedPrompts); not a reward column
DATASET_INDEX_KEY = "dataset_index"


class IndexedPrompts(Dataset):
    """Prompt rows, each with its index in the dataset under :data:`DATASET_INDEX_KEY`: the index seeds the row's
    completions (:func:`completion_generators`), so what a prompt samples does not depend on the batch, rank or
    micro-batch it lands in.

    Args:
        dataset (Dataset): rows ``{"tokens": [...], "prompt": str, <reward columns>...}`` (e.g.
            ``tune.datasets.prompt_dataset``).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.dataset[index], DATASET_INDEX_KEY: index}


def completion_seed(seed: int, epoch: int, index: int, sample: int) -> int:
    """The seed of one completion's generator: a hash of the run's seed, the epoch, the prompt's dataset index and
    the completion's number within its group.

    A prompt is drawn once per epoch, so these four name one completion of the run whatever the batch size, the
    number of ranks or the step at which a resumed run restarts. The hash (BLAKE2b) keeps nearby tuples' seeds
    unrelated and is the same on every platform and Python process.

    Args:
        seed (int): the run's seed.
        epoch (int): the epoch (0-based).
        index (int): the prompt's index in the dataset.
        sample (int): the completion's number within the prompt's group (0-based).

    Returns:
        int: a seed in ``[0, 2**63)``.
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def completion_generators(
    seed: int, epoch: int, indices: Sequence[int], group_size: int, device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One generator per completion, ``group_size`` per prompt, in the order the prompts' groups are sampled
    (a prompt's completions consecutive): the sampling rule of every GRPO recipe.

    Passed as ``rng`` to ``tune.generation.generate``, each row of a batched generation draws its noise from its own
    generator, so a completion is the same on one device, on any number of ranks, in any micro-batch, and after a
    resume (no generator state to save).

    Args:
        seed (int): the run's seed.
        epoch (int): the epoch (0-based).
        indices (Sequence[int]): the prompts' dataset indices (:data:`DATASET_INDEX_KEY` of each row).
        group_size (int): completions per prompt.
        device (torch.device | str): where the sampling noise is drawn (the model's device). Default ``"cpu"``.

    Returns:
        list[torch.Generator]: ``len(indices) * group_size`` seeded generators.
    """
    return [
        torch.Generator(device=device).manual_seed(completion_seed(seed, epoch, index, sample))
        for index in indices
        for sample in range(group_size)
    ]


class GRPOTrajectory(NamedTuple):
    """A batch of sampled completions, scored: what the optimisation passes of a GRPO step need.

    Attributes:
        sequences (torch.Tensor): ``[n, p + t]`` the left-padded prompt, then the completion.
        positions (torch.Tensor): ``[n, p + t]`` position ids, 0 at each row's first real token.
        attention (torch.Tensor): ``[n, p + t, p + t]`` bool causal mask that leaves out the padding.
        completions (torch.Tensor): ``[n, t]`` the sampled tokens.
        mask (torch.Tensor): ``[n, t]`` bool, the completion's tokens (up to and including its first stop token).
        advantages (torch.Tensor): ``[n]`` group-normalised (:func:`grpo_advantages`).
        ref_logprobs (torch.Tensor | None): ``[n, t]`` under the reference model, when the loss has a KL term.
    """

    sequences: torch.Tensor
    positions: torch.Tensor
    attention: torch.Tensor
    completions: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None


def grpo_trajectory(
    prompt_tokens: torch.Tensor,
    prompt_padding: torch.Tensor,
    completions: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
) -> GRPOTrajectory:
    """The trajectory of sampled, scored completions: the sequences and the positions and attention mask that let
    each left-padded row compute what it would alone.

    Args:
        prompt_tokens (torch.Tensor): ``[n, p]`` the left-padded prompts (a prompt repeated for each completion).
        prompt_padding (torch.Tensor): ``[n, p]`` bool, True on the prompts' real tokens.
        completions (torch.Tensor): ``[n, t]`` the sampled tokens.
        mask (torch.Tensor): ``[n, t]`` bool (:func:`completion_mask`).
        advantages (torch.Tensor): ``[n]`` (:func:`grpo_advantages`).

    Returns:
        GRPOTrajectory: with ``ref_logprobs`` None (``trajectory._replace(ref_logprobs=...)`` adds them).
    """
    # every generated position is real: what follows a stop token is attended, but masked out of the loss
    padding = torch.cat([prompt_padding, torch.ones_like(completions, dtype=torch.bool)], dim=1)
    return GRPOTrajectory(
        sequences=torch.cat([prompt_tokens, completions], dim=1),
        positions=get_position_ids_from_padding_mask(padding),
        attention=get_causal_mask_from_padding_mask(padding),
        completions=completions,
        mask=mask,
        advantages=advantages,
        ref_logprobs=None,
    )


def trajectory_log_probs(
    model: nn.Module, trajectory: GRPOTrajectory, rows: slice, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probabilities of some rows' completions under ``model`` (one forward pass).

    Args:
        model (nn.Module): called as ``model(tokens, input_pos=..., mask=...)``, returning ``[b, s, vocab]`` logits.
        trajectory (GRPOTrajectory): the batch.
        rows (slice): the rows to score (a micro-batch).
        temperature (float): the sampling temperature (see :func:`completion_log_probs`). Default 1.0.

    Returns:
        torch.Tensor: ``[rows, t]`` float32.
    """
    prompt_len = trajectory.sequences.shape[1] - trajectory.completions.shape[1]
    logits = model(trajectory.sequences[rows], input_pos=trajectory.positions[rows], mask=trajectory.attention[rows])
    # position i predicts token i + 1: the completion's logits start at the prompt's last position
    return completion_log_probs(logits[:, prompt_len - 1 : -1], trajectory.completions[rows], temperature)


def decode_completions(
    tokenizer: Any, completions: torch.Tensor, mask: torch.Tensor, stop_tokens: Sequence[int]
) -> list[str]:
    """The text of each completion, as reward functions read it: its masked tokens without the final stop token.

    A sampled id the tokenizer cannot decode (one of the model's padded embedding rows past the vocabulary, as
    Qwen2.5's 151,936 rows for 151,665 tokens) has no text and is left out. Reads the tensors: one host-device
    sync.

    Args:
        tokenizer (Any): anything with ``decode(list[int]) -> str``.
        completions (torch.Tensor): ``[n, t]`` token ids.
        mask (torch.Tensor): ``[n, t]`` bool (:func:`completion_mask`).
        stop_tokens (Sequence[int]): the ids that end a completion.

    Returns:
        list[str]: ``n`` texts.
    """
    stops = set(stop_tokens)
    texts = []
    for row, keep in zip(completions.tolist(), mask.tolist(), strict=True):
        kept = [token for token, in_completion in zip(row, keep) if in_completion]
        if kept and kept[-1] in stops:
            kept = kept[:-1]  # the stop token ends the completion; it is not part of its text
        texts.append(_decode(tokenizer, kept))
    return texts


def _decode(tokenizer: Any, tokens: list[int]) -> str:
    try:
        return tokenizer.decode(tokens)
    except (KeyError, IndexError, ValueError):
        return tokenizer.decode([token for token in tokens if _decodable(tokenizer, token)])


def _decodable(tokenizer: Any, token: int) -> bool:
    try:
        tokenizer.decode([token])
        return True
    except (KeyError, IndexError, ValueError):
        return False


def grpo_metrics(
    rewards: torch.Tensor,
    per_function: torch.Tensor,
    names: Sequence[str],
    completions: torch.Tensor,
    mask: torch.Tensor,
    stop_tokens: Sequence[int],
) -> dict[str, torch.Tensor]:
    """The statistics of a batch of scored completions that a GRPO recipe logs (0-d tensors, not read here).

    Args:
        rewards (torch.Tensor): ``[n]`` the weighted total of each completion.
        per_function (torch.Tensor): ``[n, k]`` each reward function's rewards.
        names (Sequence[str]): the ``k`` functions' names (:func:`reward_name`).
        completions (torch.Tensor): ``[n, t]`` the sampled tokens.
        mask (torch.Tensor): ``[n, t]`` bool (:func:`completion_mask`).
        stop_tokens (Sequence[int]): the ids that end a completion.

    Returns:
        dict[str, torch.Tensor]: ``reward`` and ``reward_std`` (of the totals), ``rewards/<name>/mean`` and
        ``rewards/<name>/std`` per function, ``completions/mean_length`` (tokens, the stop token included) and
        ``completions/clipped_ratio`` (the share that never stopped: cut at ``max_generated_tokens``).
    """
    values = {"reward": rewards.mean(), "reward_std": rewards.std()}
    for name, column in zip(names, per_function.unbind(dim=1), strict=True):
        values[f"rewards/{name}/mean"] = column.mean()
        values[f"rewards/{name}/std"] = column.std()
    values["completions/mean_length"] = mask.sum(dim=1).float().mean()
    stops = torch.as_tensor(list(stop_tokens), dtype=completions.dtype, device=completions.device)
    values["completions/clipped_ratio"] = (~torch.isin(completions, stops).any(dim=1)).float().mean()
    return values
