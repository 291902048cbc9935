"""The metrics of preference training under TRL's names, accumulated on the device over whole steps."""

from collections.abc import Callable

import torch

from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.rlhf._sequence_processing import completion_logit_sums

# slots of the running sums
_PAIRS, _CHOSEN_REWARD, _REJECTED_REWARD, _CORRECT, _CHOSEN_LOGPS, _REJECTED_LOGPS = range(6)
_CHOSEN_LOGITS, _CHOSEN_TOKENS, _REJECTED_LOGITS, _REJECTED_TOKENS = range(6, 10)
_NLL, _NLL_TOKENS, _ODDS_PAIRS, _LOG_SIGMOID_ODDS, _LOG_ODDS = range(10, 15)  # ORPO's


class PreferenceMetrics:
    """Running sums of the preference metrics, read at logging steps (one host-device sync per read).

    Averaged over every pair seen since the last read (all micro-batches of all steps in between):
    ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins`` (chosen minus rejected), ``rewards/accuracies``
    (the share of pairs whose chosen reward is strictly higher: 0 when policy == reference), ``logps/chosen`` and
    ``logps/rejected`` (the sequence log-probabilities given to the loss). ``logits/chosen`` and
    ``logits/rejected`` are the policy's logits averaged over the vocabulary and over every completion token
    (token-weighted, as TRL does within a batch).

    ORPO adds, when :meth:`update` is given them: ``nll_loss``, the chosen sequences' negative log-likelihood per
    token (over every token of the window); ``log_odds_ratio`` and ``log_odds_chosen``, the pair means of
    ``log sigmoid(z)`` and of the log odds ratio ``z`` (``tune.rlhf.loss.ORPOLoss.log_odds``).

    Args:
        device (torch.device): where the sums live (the training device).
    """

    def __init__(self, device: torch.device) -> None:
        self._sums = torch.zeros(15, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(
        self,
        chosen_rewards: torch.Tensor,
        rejected_rewards: torch.Tensor,
        chosen_log_probs: torch.Tensor,
        rejected_log_probs: torch.Tensor,
        logits: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
        *,
        logit_sums: torch.Tensor | None = None,
        num_tokens: torch.Tensor | None = None,
        nll_sum: torch.Tensor | None = None,
        nll_tokens: torch.Tensor | None = None,
        log_odds: torch.Tensor | None = None,
    ) -> None:
        """Adds one micro-batch of pairs.

        The logits metrics come from the full ``logits`` and ``labels``, or from their per-row reductions
        ``logit_sums`` and ``num_tokens`` (``tune.rlhf.sequence_log_probs`` computes those without the full logits).

        Args:
            chosen_rewards (torch.Tensor): ``[b]`` from the loss.
            rejected_rewards (torch.Tensor): ``[b]`` from the loss.
            chosen_log_probs (torch.Tensor): ``[b]`` policy log-probabilities of the chosen completions.
            rejected_log_probs (torch.Tensor): ``[b]``, of the rejected completions.
            logits (torch.Tensor | None): the policy's logits ``[2b, s, v]``, chosen rows first (None, and no
                ``logit_sums``: the logits metrics are left out).
            labels (torch.Tensor | None): ``[2b, s]`` labels of those rows (not shifted).
            ignore_index (int): the label of positions outside the completions. Default -100.
            logit_sums (torch.Tensor | None): ``[2b]`` per row, the sum over its completion positions of the
                vocabulary-mean logit (instead of ``logits``), chosen rows first.
            num_tokens (torch.Tensor | None): ``[2b]`` completion tokens of each row, with ``logit_sums``.
            nll_sum (torch.Tensor | None): the summed negative log-likelihood of the chosen sequences (ORPO).
            nll_tokens (torch.Tensor | None): the number of tokens in ``nll_sum``.
            log_odds (torch.Tensor | None): ``[b]`` the log odds ratio of each pair (ORPO).

        Raises:
            ValueError: when ``logits`` and ``logit_sums`` are both given, or only one of ``logit_sums`` and
                ``num_tokens`` (or of ``nll_sum`` and ``nll_tokens``).
        """
        if logits is not None and logit_sums is not None:
            raise ValueError("PreferenceMetrics.update takes the logits or their logit_sums, not both.")
        if (logit_sums is None) != (num_tokens is None):
            raise ValueError("PreferenceMetrics.update needs logit_sums and num_tokens together.")
        if (nll_sum is None) != (nll_tokens is None):
            raise ValueError("PreferenceMetrics.update needs nll_sum and nll_tokens together.")
        if nll_sum is not None:
            self._sums[_NLL : _NLL_TOKENS + 1] += torch.stack([nll_sum.detach().sum(), nll_tokens.sum()]).to(self._sums)
        if log_odds is not None:
            log_odds = log_odds.detach().double()
            self._sums[_ODDS_PAIRS:] += torch.stack(
                [torch.ones_like(log_odds).sum(), torch.nn.functional.logsigmoid(log_odds).sum(), log_odds.sum()]
            ).to(self._sums)
        sums = torch.stack(
            [
                torch.ones_like(chosen_rewards).sum(),  # the pair count, without a host-to-device copy
                chosen_rewards.sum(),
                rejected_rewards.sum(),
                (chosen_rewards > rejected_rewards).sum(),
                chosen_log_probs.sum(),
                rejected_log_probs.sum(),
            ]
        ).to(self._sums)
        self._sums[:_CHOSEN_LOGITS] += sums
        if logits is not None and labels is not None:
            logit_sums, num_tokens = completion_logit_sums(logits, labels.to(logits.device), ignore_index)
        if logit_sums is None:
            return
        chosen_logits, rejected_logits = logit_sums.detach().chunk(2)
        chosen_tokens, rejected_tokens = num_tokens.chunk(2)
        self._sums[_CHOSEN_LOGITS:_NLL] += torch.stack(
            [chosen_logits.sum(), chosen_tokens.sum(), rejected_logits.sum(), rejected_tokens.sum()]
        ).to(self._sums)

    def compute(self, all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """The averages since the last call, under TRL's names; starts a new window.

        Args:
            all_reduce (Callable | None): sums a tensor over data-parallel ranks (distributed recipes).

        Returns:
            dict[str, float]: the metrics (empty when no pair was added).
        """
        sums = self._sums.clone() if all_reduce is None else all_reduce(self._sums.clone())
        self._sums.zero_()
        values = sums.tolist()  # the one host-device sync
        pairs = values[_PAIRS]
        if pairs == 0:
            return {}
        chosen, rejected = values[_CHOSEN_REWARD] / pairs, values[_REJECTED_REWARD] / pairs
        metrics = {
            "rewards/chosen": chosen,
            "rewards/rejected": rejected,
            "rewards/accuracies": values[_CORRECT] / pairs,
            "rewards/margins": chosen - rejected,
            "logps/chosen": values[_CHOSEN_LOGPS] / pairs,
            "logps/rejected": values[_REJECTED_LOGPS] / pairs,
        }
        if values[_CHOSEN_TOKENS] > 0:
            metrics["logits/chosen"] = values[_CHOSEN_LOGITS] / values[_CHOSEN_TOKENS]
        if values[_REJECTED_TOKENS] > 0:
            metrics["logits/rejected"] = values[_REJECTED_LOGITS] / values[_REJECTED_TOKENS]
        if values[_NLL_TOKENS] > 0:
            metrics["nll_loss"] = values[_NLL] / values[_NLL_TOKENS]
        if values[_ODDS_PAIRS] > 0:
            metrics["log_odds_ratio"] = values[_LOG_SIGMOID_ODDS] / values[_ODDS_PAIRS]
            metrics["log_odds_chosen"] = values[_LOG_ODDS] / values[_ODDS_PAIRS]
        return metrics
