"""The metrics of KTO under TRL's names, and the held-out *desirable rate*, accumulated over whole steps."""

from collections import defaultdict
from collections.abc import Callable

import torch
import torch.distributed as dist

from tune.data import CROSS_ENTROPY_IGNORE_IDX

# slots of the running sums
_CHOSEN, _REJECTED, _CHOSEN_REWARD, _REJECTED_REWARD, _CHOSEN_LOGPS, _REJECTED_LOGPS = range(6)
_CHOSEN_LOGITS, _CHOSEN_TOKENS, _REJECTED_LOGITS, _REJECTED_TOKENS, _KL, _KL_STEPS = range(6, 12)


class KTOMetrics:
    """Running sums of the KTO metrics, read at logging steps (one host-device sync per read).

    Averaged over the examples seen since the last read: ``rewards/chosen`` and ``logps/chosen`` over the desirable
    examples, ``rewards/rejected`` and ``logps/rejected`` over the undesirable ones, ``rewards/margins`` (chosen
    minus rejected, when both kinds were seen); ``logits/chosen`` and ``logits/rejected`` are the policy's logits
    averaged over the vocabulary and the completion tokens of each kind; ``kl`` is the mean of the steps' KL
    estimates. TRL's ``KTOTrainer`` logs the same names (per micro-batch, then averaged).

    Args:
        device (torch.device): where the sums live (the training device).
    """

    def __init__(self, device: torch.device) -> None:
        self._sums = torch.zeros(12, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(
        self,
        rewards: torch.Tensor,
        log_probs: torch.Tensor,
        desirable: torch.Tensor,
        logit_sums: torch.Tensor,
        num_tokens: torch.Tensor,
    ) -> None:
        """Adds one micro-batch of examples.

        Args:
            rewards (torch.Tensor): ``[b]`` implicit rewards from the loss.
            log_probs (torch.Tensor): ``[b]`` policy log-probabilities of the completions.
            desirable (torch.Tensor): ``[b]`` bool.
            logit_sums (torch.Tensor): ``[b]`` per row, the sum over its completion positions of the vocabulary-mean
                logit (``tune.rlhf.SequenceLogProbs.logit_sums``).
            num_tokens (torch.Tensor): ``[b]`` completion tokens of each row.
        """
        chosen = desirable.to(device=rewards.device, dtype=torch.bool)
        rejected = ~chosen
        values = []
        for mask in (chosen, rejected):
            values.append(mask.sum())
        for value in (rewards, log_probs):
            values += [value.detach()[chosen].sum(), value.detach()[rejected].sum()]
        logit_sums, num_tokens = logit_sums.detach().to(rewards.device), num_tokens.to(rewards.device)
        values += [logit_sums[chosen].sum(), num_tokens[chosen].sum()]
        values += [logit_sums[rejected].sum(), num_tokens[rejected].sum()]
        self._sums[:_KL] += torch.stack([v.to(self._sums) for v in values])

    @torch.no_grad()
    def update_kl(self, kl: torch.Tensor) -> None:
        """Adds one step's KL estimate."""
        self._sums[_KL] += kl.detach().to(self._sums)
        self._sums[_KL_STEPS] += 1

    def compute(self, all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """The averages since the last call, under TRL's names; starts a new window.

        Args:
            all_reduce (Callable | None): sums a tensor over data-parallel ranks (distributed recipes). The KL
                estimates are the same on every rank: they are averaged, not summed.

        Returns:
            dict[str, float]: the metrics (a kind of example not seen is left out).
        """
        sums = self._sums.clone()
        kl_sum, kl_steps = sums[_KL].item(), sums[_KL_STEPS].item()
        if all_reduce is not None:
            sums = all_reduce(sums)
        self._sums.zero_()
        values = sums.tolist()  # the one host-device sync
        metrics = {}
        if kl_steps:
            metrics["kl"] = kl_sum / kl_steps
        for kind, count, reward, logps, logits, tokens in (
            ("chosen", _CHOSEN, _CHOSEN_REWARD, _CHOSEN_LOGPS, _CHOSEN_LOGITS, _CHOSEN_TOKENS),
            ("rejected", _REJECTED, _REJECTED_REWARD, _REJECTED_LOGPS, _REJECTED_LOGITS, _REJECTED_TOKENS),
        ):
            if values[count] > 0:
                metrics[f"rewards/{kind}"] = values[reward] / values[count]
                metrics[f"logps/{kind}"] = values[logps] / values[count]
            if values[tokens] > 0:
                metrics[f"logits/{kind}"] = values[logits] / values[tokens]
        if "rewards/chosen" in metrics and "rewards/rejected" in metrics:
            metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
        return metrics


class DesirableRate:
    """The held-out *desirable rate*: over every (desirable, undesirable) pair of held-out examples that share a
    prompt, the fraction in which the policy gives the desirable completion the higher summed log-probability.

    Unlike the implicit rewards (all 0 before training, when the policy is the reference) it measures the model
    itself, so it can be compared between the start and the end of a run. Examples whose prompt has only one kind
    of completion are not counted. Meant for validation: :meth:`update` copies each batch's prompts to the host.
    """

    def __init__(self) -> None:
        self._by_prompt: dict[tuple[int, ...], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))

    @torch.no_grad()
    def update(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        log_probs: torch.Tensor,
        desirable: torch.Tensor,
        ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
    ) -> None:
        """Adds one batch.

        Args:
            tokens (torch.Tensor): ``[b, s]``.
            labels (torch.Tensor): ``[b, s]``, ``ignore_index`` on the prompt (and padding).
            log_probs (torch.Tensor): ``[b]`` the policy's summed log-probabilities of the completions.
            desirable (torch.Tensor): ``[b]`` bool.
            ignore_index (int): the ignored label. Default -100.
        """
        tokens, labels = tokens.cpu(), labels.cpu()
        scored = labels != ignore_index
        # the prompt: the tokens before the first scored one
        starts = torch.where(scored.any(dim=1), scored.int().argmax(dim=1), torch.full_like(labels[:, 0], -1))
        for row, (start, value, good) in enumerate(
            zip(starts.tolist(), log_probs.float().tolist(), desirable.tolist())
        ):
            prompt = tuple(tokens[row, : start if start >= 0 else tokens.shape[1]].tolist())
            self._by_prompt[prompt][0 if good else 1].append(value)

    def compute(self, all_ranks: bool = False) -> tuple[float, int]:
        """The rate and the number of comparisons it is over (``nan`` and 0 when no prompt has both kinds).

        Args:
            all_ranks (bool): distributed recipes: compare the examples of every rank, whichever rank scored them
                (a collective: the log-probabilities by prompt are gathered from every rank). Default False.
        """
        by_prompt = self._by_prompt
        if all_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, dict(self._by_prompt))
            by_prompt = defaultdict(lambda: ([], []))
            for part in gathered:
                for prompt, (good, bad) in part.items():
                    by_prompt[prompt][0].extend(good)
                    by_prompt[prompt][1].extend(bad)
        wins = comparisons = 0
        for good, bad in by_prompt.values():
            for value in good:
                wins += sum(value > other for other in bad)
                comparisons += len(bad)
        return (wins / comparisons if comparisons else float("nan")), comparisons


def check_unpaired_dataset(dataset, needs_kl: bool) -> None:
    """The dataset gives unpaired examples (``input_ids``, ``labels``, ``label``), with KL rows when the loss needs
    them.

    Args:
        dataset (Any): a map-style dataset, e.g. ``tune.datasets.unpaired_preference_dataset(...)``.
        needs_kl (bool): whether the loss uses the KL estimate (``KTOLoss.needs_kl``).

    Raises:
        ValueError: naming the keys found and the fix.
    """
    sample_keys = sorted(dataset[0]) if len(dataset) else []
    if not {"input_ids", "labels", "label"} <= set(sample_keys):
        raise ValueError(
            f"gives samples with keys {sample_keys}; KTO trains on unpaired examples (input_ids, labels, label). "
            "Use tune.datasets.unpaired_preference_dataset or tune.datasets.unpaired_from_pairs"
        )
    if needs_kl and not {"kl_input_ids", "kl_labels"} <= set(sample_keys):
        raise ValueError(
            "gives samples without KL rows (kl_input_ids, kl_labels), which loss_type 'kto' needs for its KL "
            "estimate. Set the dataset's kl_group_size (TRL's pairing: the batch size), or use "
            "loss.loss_type=apo_zero_unpaired"
        )
