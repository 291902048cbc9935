"""Prompt datasets for RL fine-tuning (GRPO): a prompt to generate from and the row's other columns (the
reference answer, ...) for the reward functions.
"""

import logging
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import Message, ModelTokenizer
from tune.datasets import _hf
from tune.utils import get_logger, log_rank_zero

_log = get_logger(name=__name__)

# the system prompt of gsm8k_dataset: ask for the format FormatReward and AnswerReward read
GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem. Reason step by step inside <think> </think>, then write only the final number "
    "inside <answer> </answer>."
)


class PromptDataset(Dataset):
    """Rows of a dataset as prompts to complete, with the row's other columns.

    Each item is a dict: ``tokens`` (the prompt's token ids, ending where the model's answer begins: the
    tokenizer's chat format with an open assistant turn, no end-of-turn token), ``prompt`` (its text, for the
    reward functions), and every other column of the row under its own name (``answer``, ...). The prompt column
    holds either a string (one user message) or a list of ``{role, content}`` messages.

    Args:
        source (str): hub name, builder (``"json"``) with ``data_files``, directory or file.
        tokenizer (ModelTokenizer): the model's tokenizer.
        prompt_column (str): the column of the prompt. Default ``"prompt"``.
        system_prompt (str | None): a system message put before each prompt (one the row has is replaced).
            Default None.
        filter_fn (Callable | None): keep a raw row when it returns True. Default None.
        split (str): split to load. Default ``"train"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Prompts longer than the tokenizer's ``max_seq_len`` are left out, with a warning that counts them: cut, a
    prompt would lose its end (the question, the chat format's answer header) and the model would continue the
    cut text. Every prompt is tokenised once here to measure it.

    Raises:
        ValueError: for a missing prompt column, no rows, no prompt within ``max_seq_len``, or a row whose prompt
            is neither text nor messages
            (naming its index).
    """

    def __init__(
        self,
        source: str,
        tokenizer: ModelTokenizer,
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
        filter_fn: Callable[[dict[str, Any]], bool] | None = None,
        split: str = "train",
        **load_dataset_kwargs: Any,
    ) -> None:
        self._source = _hf.describe_source(source, load_dataset_kwargs)
        rows = _hf.load_source(source, split=split, **load_dataset_kwargs)
        _hf.check_columns(rows, [prompt_column], self._source, hint="prompt_column")
        rows = _hf.filter_rows(rows, filter_fn, self._source, num_proc=1)
        if len(rows) == 0:
            raise _hf.DatasetError(f"{self._source} has no rows to take prompts from")
        self._rows = rows
        self._tokenizer, max_seq_len = _hf.untruncated(tokenizer)
        self._prompt_column = prompt_column
        self._system_prompt = system_prompt
        if max_seq_len is not None:
            self._rows = self._within(max_seq_len)

    def _within(self, max_seq_len: int):
        """The rows whose prompt fits ``max_seq_len`` tokens; warns about the others (an error when none fits)."""
        prompts = self._rows[self._prompt_column]  # one column read, not a row at a time
        lengths = [len(self._tokens(self._messages(i, prompt))) for i, prompt in enumerate(prompts)]
        kept = [i for i, n in enumerate(lengths) if n <= max_seq_len]
        if len(kept) == len(lengths):
            return self._rows
        longest = max(lengths)
        if not kept:
            raise _hf.DatasetError(
                f"{self._source}: every prompt ({len(lengths):,}) is longer than tokenizer.max_seq_len={max_seq_len} "
                f"(the longest: {longest} tokens). Raise tokenizer.max_seq_len above the prompts' length."
            )
        log_rank_zero(
            _log,
            f"{self._source}: {len(lengths) - len(kept):,} of {len(lengths):,} prompts are longer than "
            f"tokenizer.max_seq_len={max_seq_len} (the longest: {longest} tokens) and are left out: cut, they would "
            "lose the end of the question and the answer header. Raise tokenizer.max_seq_len to keep them.",
            logging.WARNING,
        )
        return self._rows.select(kept)

    def __len__(self) -> int:
        return len(self._rows)

    def _messages(self, index: int, value: Any) -> list[Message]:
        if isinstance(value, str):
            messages = [Message(role="user", content=value)]
        elif isinstance(value, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value):
            messages = [Message(role=m["role"], content=m["content"]) for m in value]
        else:
            raise _hf.DatasetError(
                f"{self._source}, row {index}: column {self._prompt_column!r} must hold text or a list of "
                f"{{role, content}} messages; got {type(value).__name__}"
            )
        if self._system_prompt is not None:
            messages = [Message(role="system", content=self._system_prompt)] + [
                m for m in messages if m.role != "system"
            ]
        return messages

    def _tokens(self, messages: list[Message]) -> list[int]:
        # an empty assistant turn opens the answer: the chat format's header for it, no end-of-turn token
        tokens, _ = self._tokenizer.tokenize_messages(
            messages + [Message(role="assistant", content="")], add_end_tokens=False
        )
        return list(tokens)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self._rows[index]
        messages = self._messages(index, row[self._prompt_column])
        sample = {key: value for key, value in row.items() if key != self._prompt_column}
        sample.update(tokens=self._tokens(messages), prompt="\n".join(m.text_content for m in messages))
        return sample


def prompt_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    prompt_column: str = "prompt",
    system_prompt: str | None = None,
    filter_fn: Callable[[dict[str, Any]], bool] | None = None,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> PromptDataset:
    """Prompts from any dataset (a local JSON file: ``source: json, data_files: prompts.json``) with their other
    columns, for the GRPO recipes. See :class:`PromptDataset`.

    Example row: ``{"prompt": "What is 3 + 4?", "answer": "7"}``; with ``tune.rlhf.AnswerReward`` the ``answer``
    column is the reference.

    Returns:
        PromptDataset: the prompts.
    """
    return PromptDataset(
        source,
        tokenizer,
        prompt_column=prompt_column,
        system_prompt=system_prompt,
        filter_fn=filter_fn,
        split=split,
        **load_dataset_kwargs,
    )


def gsm8k_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = "openai/gsm8k",
    name: str = "main",
    system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> PromptDataset:
    """GSM8K grade-school math problems (Cobbe et al., 2021, https://arxiv.org/abs/2110.14168) as prompts.

    The ``question`` column is the prompt; ``answer`` keeps the worked solution ending in ``#### <number>``,
    which ``tune.rlhf.AnswerReward`` reduces to the number. The default system prompt asks for
    ``<think>...</think><answer>...</answer>`` (what ``tune.rlhf.FormatReward`` checks).

    Returns:
        PromptDataset: the prompts.
    """
    return PromptDataset(
        source,
        tokenizer,
        prompt_column="question",
        system_prompt=system_prompt,
        split=split,
        name=name,
        **load_dataset_kwargs,
    )
