from collections.abc import Callable
from typing import Any

from tune.data import ModelTokenizer
from tune.datasets._text_completion import TextCompletionDataset


def cnn_dailymail_articles_dataset(
    tokenizer: ModelTokenizer,
    source: str = "ccdv/cnn_dailymail",
    max_seq_len: int | None = None,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> TextCompletionDataset:
    """The news articles of CNN / Daily Mail (version ``3.0.0``, column ``article``) as plain text: each
    article is one sample (BOS, text, EOS) with loss on every token. The summaries are not used.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file. Default ``"ccdv/cnn_dailymail"``.
        max_seq_len (int | None): cut articles to this many tokens (the tokenizer's ``max_seq_len`` cuts too;
            the smaller applies). Default None.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``name`` defaults to ``"3.0.0"``).

    Returns:
        TextCompletionDataset: the tokenised articles.

    Raises:
        ValueError: see :class:`~tune.datasets.TextCompletionDataset`.
    """
    load_dataset_kwargs.setdefault("name", "3.0.0")
    return TextCompletionDataset(
        tokenizer, source, column="article", filter_fn=filter_fn, split=split, num_proc=num_proc,
        max_seq_len=max_seq_len, **load_dataset_kwargs,
    )  # fmt: skip
