from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import ModelTokenizer
from tune.datasets._packed import maybe_pack
from tune.datasets._text_completion import TextCompletionDataset


def wikitext_dataset(
    tokenizer: ModelTokenizer,
    source: str = "EleutherAI/wikitext_document_level",
    subset: str = "wikitext-103-v1",
    max_seq_len: int | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """WikiText, one Wikipedia article per row (column ``page``), for continued pre-training: each article is
    one sample (BOS, text, EOS) with loss on every token.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
            Default ``"EleutherAI/wikitext_document_level"``.
        subset (str): the dataset configuration, passed to ``datasets.load_dataset`` as ``name``.
            Default ``"wikitext-103-v1"``.
        max_seq_len (int | None): cut articles to this many tokens (the tokenizer's ``max_seq_len`` cuts too;
            the smaller applies). Default None.
        packed (bool): pack articles into ``tokenizer.max_seq_len`` rows, an article continuing into the next
            pack. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: a :class:`~tune.datasets.TextCompletionDataset`, or a :class:`~tune.data.PackedDataset`.

    Raises:
        ValueError: see :class:`~tune.datasets.TextCompletionDataset`; also ``packed`` without the tokenizer's
            ``max_seq_len``.
    """
    ds = TextCompletionDataset(
        tokenizer, source, column="page", filter_fn=filter_fn, split=split, num_proc=num_proc,
        max_seq_len=max_seq_len, name=subset, **load_dataset_kwargs,
    )  # fmt: skip
    return maybe_pack(ds, tokenizer, packed, split_across_pack=True)
