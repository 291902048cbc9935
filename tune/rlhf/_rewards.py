"""Reward functions for RL fine-tuning on verifiable tasks (GRPO), as components.

A reward function is any callable ``fn(prompts, completions, **fields)`` where ``prompts`` and ``completions``
are lists of strings of the same length (one entry per completion: a prompt appears once per completion sampled
from it) and ``fields`` holds the dataset row's other columns as lists aligned with them (``answer=[...]``). It
returns one reward per completion: a float tensor ``[num_completions]`` or a list of floats. This is the
signature TRL's ``GRPOTrainer`` calls its reward functions with, so those plug in unchanged.

A recipe names its reward functions in the config, a reward object by ``_component_`` (built with the node's
arguments) and a plain function by its dotted path, and weighs them with ``reward_weights``::

    reward_functions:
      - _component_: tune.rlhf.AnswerReward
      - _component_: tune.rlhf.FormatReward
      - my_rewards.length_penalty        # def length_penalty(prompts, completions, **fields) -> list[float]
    reward_weights: [1.0, 0.2, 0.1]

The name a reward is logged under (``rewards/<name>/mean``) is its ``name`` attribute, else its ``__name__``,
else its class name.
"""

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tune.rlhf._grpo import DATASET_INDEX_KEY

RewardFunction = Callable[..., "torch.Tensor | Sequence[float]"]

# the format DeepSeek-R1 (https://arxiv.org/abs/2501.12948) rewards: reasoning, then the answer, nothing else
THINK_ANSWER_FORMAT = r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def reward_name(reward_function: Any) -> str:
    """The name a reward function's metrics are logged under: its ``name`` attribute, ``__name__`` or class
    name."""
    name = getattr(reward_function, "name", None) or getattr(reward_function, "__name__", None)
    return str(name or type(reward_function).__name__)


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text``, braces balanced; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None  # unbalanced: not an answer


def extract_answer(text: str, pattern: str | None = None) -> str | None:
    """The final answer written in ``text``.

    With a ``pattern`` (a regular expression), the first group of its last match (the whole match if it has no
    group). Without one, the first of these that ``text`` has: the last ``\\boxed{...}``, the last
    ``<answer>...</answer>``, what follows the last ``####`` (GSM8K's answer line); else the whole text.

    Args:
        text (str): a completion or a reference answer.
        pattern (str | None): a regular expression for the answer. Default None.

    Returns:
        str | None: the answer, stripped; None when ``pattern`` does not match or a marker is left unclosed.
    """
    if pattern is not None:
        matches = list(re.finditer(pattern, text, flags=re.DOTALL))
        if not matches:
            return None
        last = matches[-1]
        return (last.group(1) if last.re.groups else last.group(0)).strip()
    if "\\boxed{" in text:
        boxed = _last_boxed(text)
        return None if boxed is None else boxed.strip()
    tags = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    if tags:
        return tags[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return text.strip()


def normalize_answer(answer: str) -> str:
    """Canonical form of an answer for exact match: whitespace collapsed, a trailing period, ``$`` and the
    thousands separators of a number removed, and a number written in its shortest form (``42.0`` -> ``42``)."""
    text = " ".join(answer.split()).rstrip(".").replace("$", "").strip()
    plain = text.replace(",", "")
    if _NUMBER.match(plain):
        value = float(plain)
        if math.isfinite(value):
            return str(int(value)) if value == int(value) else repr(value)
    return text


class AnswerReward:
    """A verifiable-answer reward: ``correct_reward`` when the answer extracted from the completion equals the
    row's reference answer (after :func:`normalize_answer`), ``incorrect_reward`` otherwise (also when the
    completion has no answer).

    Args:
        answer_key (str): the dataset column holding the reference answer. Default ``"answer"``.
        pattern (str | None): a regular expression for the completion's answer (its first group); None: the
            markers of :func:`extract_answer` (``\\boxed{}``, ``<answer>`` tags, ``####``), else the whole
            completion. Default None.
        reference_pattern (str | None): the same for the reference answer; None: :func:`extract_answer`'s
            markers (a GSM8K answer ``... #### 42`` gives ``42``). Default None.
        correct_reward (float): reward of a correct answer. Default 1.0.
        incorrect_reward (float): reward of any other completion. Default 0.0.
        name (str): logged as ``rewards/<name>/mean``. Default ``"answer"``.
    """

    def __init__(
        self,
        answer_key: str = "answer",
        pattern: str | None = None,
        reference_pattern: str | None = None,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        name: str = "answer",
    ) -> None:
        for label, value in (("pattern", pattern), ("reference_pattern", reference_pattern)):
            if value is not None:
                try:
                    re.compile(value)
                except re.error as err:
                    raise ValueError(f"{label} is not a valid regular expression ({err}): {value!r}") from err
        self.answer_key = answer_key
        self.pattern = pattern
        self.reference_pattern = reference_pattern
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self.name = name

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[Any]) -> torch.Tensor:
        """Scores each completion against its row's answer.

        Raises:
            ValueError: if the rows have no ``answer_key`` column.
        """
        if self.answer_key not in fields:
            raise ValueError(
                f"AnswerReward reads the reference answer from the dataset column {self.answer_key!r}, but the rows "
                f"have {sorted(fields)}; set answer_key to the column that holds it"
            )
        rewards = []
        for completion, reference in zip(completions, fields[self.answer_key], strict=True):
            answer = extract_answer(completion, self.pattern)
            expected = extract_answer(str(reference), self.reference_pattern)
            correct = (
                answer is not None and expected is not None and normalize_answer(answer) == normalize_answer(expected)
            )
            rewards.append(self.correct_reward if correct else self.incorrect_reward)
        return torch.tensor(rewards, dtype=torch.float32)


class FormatReward:
    """A format reward: ``reward`` when the whole completion matches ``pattern``, 0 otherwise.

    Args:
        pattern (str): a regular expression the whole completion must match (``.`` matches newlines). Default
            ``<think>...</think><answer>...</answer>`` with only whitespace around (:data:`THINK_ANSWER_FORMAT`).
        reward (float): reward of a well-formed completion. Default 1.0.
        name (str): logged as ``rewards/<name>/mean``. Default ``"format"``.
    """

    def __init__(self, pattern: str = THINK_ANSWER_FORMAT, reward: float = 1.0, name: str = "format") -> None:
        try:
            self._regex = re.compile(pattern, flags=re.DOTALL)
        except re.error as err:
            raise ValueError(f"pattern is not a valid regular expression ({err}): {pattern!r}") from err
        self.pattern = pattern
        self.reward = reward
        self.name = name

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[Any]) -> torch.Tensor:
        """Scores each completion's format."""
        return torch.tensor(
            [self.reward if self._regex.fullmatch(c) else 0.0 for c in completions], dtype=torch.float32
        )


def score_completions(
    reward_functions: Sequence[RewardFunction],
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: dict[str, Sequence[Any]],
    weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs every reward function and combines their rewards by weight.

    Args:
        reward_functions (Sequence[RewardFunction]): the reward functions (see the module docstring).
        prompts (Sequence[str]): one per completion.
        completions (Sequence[str]): the completions' text.
        fields (dict[str, Sequence[Any]]): the rows' other columns, one entry per completion.
        weights (Sequence[float] | None): one weight per reward function; None: 1 each. Default None.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: the weighted sum ``[n]`` and each function's rewards ``[n, k]``
        (float32, on the CPU).

    Raises:
        ValueError: for no reward functions, a number of weights that differs from theirs, or a reward function
            that returns the wrong number of rewards or a non-finite one (naming it).
    """
    if not reward_functions:
        raise ValueError("no reward functions: list at least one under reward_functions")
    if weights is None:
        weights = [1.0] * len(reward_functions)
    if len(weights) != len(reward_functions):
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {len(reward_functions)} reward functions; give one weight "
            "per reward function, or null for 1 each"
        )
    columns = []
    for function in reward_functions:
        rewards = torch.as_tensor(function(list(prompts), list(completions), **fields), dtype=torch.float32).cpu()
        if rewards.shape != (len(completions),):
            raise ValueError(
                f"reward function {reward_name(function)!r} returned rewards of shape {tuple(rewards.shape)}; "
                f"expected one per completion: ({len(completions)},)"
            )
        if not torch.isfinite(rewards).all():
            raise ValueError(f"reward function {reward_name(function)!r} returned a NaN or infinite reward")
        columns.append(rewards)
    per_function = torch.stack(columns, dim=1)  # [n, k]
    total = per_function @ torch.tensor([float(w) for w in weights], dtype=torch.float32)
    return total, per_function


# the columns of a prompt row that are not passed to reward functions: the prompt's tokens, its text (passed as
# ``prompts``) and its dataset index (tune.rlhf.IndexedPrompts)
_NOT_REWARD_COLUMNS = ("tokens", "prompt", DATASET_INDEX_KEY)


class WeightedRewards:
    """The reward functions of a GRPO run with their weights: scores groups of completions of prompt rows.

    A recipe builds the functions from its config (a ``_component_`` entry instantiated, a dotted path imported)
    and passes them here with ``reward_weights``.

    Args:
        reward_functions (Sequence[RewardFunction]): reward objects or functions (see the module docstring).
        weights (Sequence[float] | None): one weight per function; None: 1 each. Default None.

    Raises:
        ValueError: for no reward functions, one that is not callable, or a number of weights that differs from
            theirs.
    """

    def __init__(self, reward_functions: Sequence[RewardFunction], weights: Sequence[float] | None = None) -> None:
        functions = list(reward_functions)
        if not functions:
            raise ValueError(
                "no reward functions: list at least one, a _component_ entry (e.g. tune.rlhf.AnswerReward) or the "
                "dotted path of a function (my_rewards.length_penalty)"
            )
        for position, function in enumerate(functions):
            if not callable(function):
                raise ValueError(
                    f"reward function {position} is a {type(function).__name__}, not a callable: a reward is called "
                    "as fn(prompts, completions, **fields)"
                )
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions):
            raise ValueError(
                f"{len(weights)} weights for {len(functions)} reward functions: give one weight per reward function, "
                "or null for 1 each"
            )
        self.functions = functions
        self.weights = weights
        self.names = [reward_name(function) for function in functions]

    def __repr__(self) -> str:
        return ", ".join(f"{name} x {weight:g}" for name, weight in zip(self.names, self.weights))

    def score(
        self, rows: Sequence[Mapping[str, Any]], completions: Sequence[str], group_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores ``group_size`` completions of each prompt row (see :func:`score_completions`).

        Args:
            rows (Sequence[Mapping[str, Any]]): the prompt rows: ``prompt`` (the text) and the columns the rewards
                read (``answer``, ...); ``tokens`` and the dataset index are not passed on.
            completions (Sequence[str]): ``len(rows) * group_size`` texts, a row's completions consecutive.
            group_size (int): completions per row.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: the weighted totals ``[n]`` and each function's rewards ``[n, k]``
            (float32, on the CPU).

        Raises:
            ValueError: for a number of completions other than ``len(rows) * group_size``, or a reward function
                that returns the wrong number of rewards or a non-finite one.
        """
        if len(completions) != len(rows) * group_size:
            raise ValueError(f"{len(completions)} completions for {len(rows)} prompts of {group_size} completions each")
        prompts = [row["prompt"] for row in rows for _ in range(group_size)]
        columns = [key for key in rows[0] if key not in _NOT_REWARD_COLUMNS] if rows else []
        fields = {key: [row[key] for row in rows for _ in range(group_size)] for key in columns}
        return score_completions(self.functions, prompts, completions, fields, self.weights)
