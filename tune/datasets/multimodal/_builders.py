"""Vision-language fine-tuning datasets: conversations with images, built one sample at a time.

Text datasets are tokenised once into Arrow (:class:`~tune.datasets.SFTDataset`); images cannot go that way (they
are large, and the model transform turns them into tensors), so :class:`MultimodalDataset` keeps the rows and, when
a sample is asked for, runs the message transform (which loads the row's images), then the model transform (which
tokenises and turns images into encoder inputs). A row that fails (a missing or corrupt image, a bad turn) raises
a ``ValueError`` naming the dataset, the row and the image, from ``__getitem__``, so it reads the same from a
DataLoader worker.
"""

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from tune.data import (
    CROSS_ENTROPY_IGNORE_IDX,
    InputOutputToMessages,
    OpenAIToMessages,
    ShareGPTToMessages,
    TheCauldronToMessages,
)
from tune.datasets import _hf
from tune.utils import get_logger

_log = get_logger(name=__name__)

# Keys of the model transform's output that do not go into the sample (the mask becomes labels).
_CONSUMED_KEYS = frozenset({"tokens", "mask", "messages"})


def _undecoded_images(features):
    """``features`` with every ``datasets.Image`` (nested in lists and dicts too) set not to decode, so its rows
    give ``{"bytes", "path"}`` for :func:`~tune.data.load_image`; other features (``Json``, ...) decode as usual."""
    import datasets

    features = copy.deepcopy(features)

    def visit(feature: Any) -> None:
        if isinstance(feature, datasets.Image):
            feature.decode = False
        elif isinstance(feature, dict):
            for value in feature.values():
                visit(value)
        elif isinstance(feature, (list, tuple)):
            for value in feature:
                visit(value)
        elif hasattr(feature, "feature"):  # Sequence, List, LargeList
            visit(feature.feature)

    visit(dict(features))
    return datasets.Features(features)  # rebuilt: it records which columns need decoding when made


class MultimodalDataset(Dataset):
    """A supervised fine-tuning dataset of conversations with images, transformed lazily, one sample per call.

    Loads ``source`` with Hugging Face ``datasets`` (images stay undecoded: paths, URLs or ``datasets.Image``
    bytes), checks the columns ``message_transform`` needs and applies ``filter_fn``. ``dataset[i]`` then runs
    ``message_transform`` on row ``i`` (it loads the images), ``model_transform`` on its messages, and returns
    ``{"tokens": [...], "labels": [...], "encoder_input": {...}}`` (plus ``"encoder_mask"`` and any other key the
    model transform adds), with ``labels`` ``-100`` where the model transform's ``mask`` is True. Truncation to
    ``max_seq_len`` is the model transform's.

    Args:
        source (str): hub name, builder (``"json"``, ``"parquet"``, ``"csv"``) with ``data_files``, local
            directory (a dataset saved with ``save_to_disk`` too) or data file.
        message_transform (Callable): row -> ``{"messages": list[Message]}`` with a ``required_columns``
            attribute, e.g. :class:`~tune.data.ShareGPTToMessages` with ``image_dir``.
        model_transform (Callable): the family's model transform: ``{"messages": [...]}`` -> ``{"tokens",
            "mask", "encoder_input", ...}``.
        filter_fn (Callable | None): keep a raw row when it returns True (applied once, when the dataset is
            built; it sees decoded images for ``datasets.Image`` columns).
        split (str): which split to load. Default ``"train"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``name``, ``cache_dir``, ...).

    Raises:
        ValueError: when building: for a missing column (naming expected and available ones) or an empty dataset
            (also after filtering). From ``dataset[i]``: for a row that cannot be turned into a sample, naming the
            dataset, the row and, for an image, its path.
    """

    def __init__(
        self,
        *,
        source: str,
        message_transform: Callable,
        model_transform: Callable,
        filter_fn: Callable | None = None,
        split: str = "train",
        **load_dataset_kwargs: Any,
    ) -> None:
        raw = _hf.load_source(source, split=split, **load_dataset_kwargs)
        source = _hf.describe_source(source, load_dataset_kwargs)  # for messages and logs
        self._required = list(getattr(message_transform, "required_columns", []))
        _hf.check_columns(raw, self._required, source)
        raw = _hf.filter_rows(raw, filter_fn, source, _hf.resolve_num_proc(None, len(raw)))
        source += " (after filter_fn; row numbers count kept rows)" if filter_fn is not None else ""
        self._source = source
        self._message_transform = message_transform
        self._model_transform = model_transform
        # Rows are read as Arrow and decoded here with images left undecoded, so a datasets.Image column gives
        # {"bytes", "path"}: a corrupt image then fails inside the transform, named, not inside datasets.
        self._rows = raw.with_format("arrow")
        self._features = _undecoded_images(raw.features)
        self.max_seq_len = getattr(model_transform, "max_seq_len", None)
        _log.info(f"Dataset {source!r}: {len(raw):,} samples (images are loaded as samples are read).")

    def __len__(self) -> int:
        return len(self._rows)

    def raw_row(self, index: int) -> dict[str, Any]:
        """Row ``index`` as stored: image columns hold paths, URLs or ``{"bytes", "path"}`` dicts."""
        return self._features.decode_example(self._rows[index].to_pylist()[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.raw_row(index)  # an IndexError here is the end of the dataset, not a bad row
        try:
            return self._sample(row)
        except (ValueError, TypeError, KeyError, IndexError, OSError) as err:
            raise _hf.row_error(self._source, index, row, err, self._required) from err
        except Exception as err:
            if hasattr(err, "add_note"):  # Python 3.11+: the row in the traceback, the error's type unchanged
                err.add_note(f"while building row {index} of dataset {self._source!r}")
            raise

    def _sample(self, row: Mapping[str, Any]) -> dict[str, Any]:
        sample = dict(self._message_transform(row))
        given = set(sample)
        transformed = self._model_transform(sample)
        missing = [key for key in ("tokens", "mask") if key not in transformed]
        if missing:
            raise ValueError(
                f"the model transform {type(self._model_transform).__name__} returned no {missing}; a model "
                f"transform must return 'tokens' and 'mask' (got keys {sorted(transformed)})."
            )
        tokens, mask = list(transformed["tokens"]), list(transformed["mask"])
        if len(tokens) != len(mask):
            raise ValueError(
                f"the model transform returned {len(tokens)} tokens but {len(mask)} mask values; they must match."
            )
        out = {"tokens": tokens, "labels": [CROSS_ENTROPY_IGNORE_IDX if m else t for t, m in zip(tokens, mask)]}
        # encoder_input, encoder_mask and whatever else the model transform adds (not what it was given)
        out.update((k, v) for k, v in transformed.items() if k not in _CONSUMED_KEYS and k not in given)
        return out


def _refuse_packing(packed: bool, builder: str) -> None:
    if packed:
        raise ValueError(
            f"{builder}: packed=True is not supported for datasets with images (a pack would have to carry the "
            "images and encoder masks of several samples). Set packed=False (dataset.packed=False in the config)."
        )


def multimodal_chat_dataset(
    model_transform: Callable,
    *,
    source: str,
    column_map: Mapping[str, str] | None = None,
    new_system_prompt: str | None = None,
    packed: bool = False,
    image_tag: str | None = None,
    image_dir: "str | Path | None" = None,
    filter_fn: Callable | None = None,
    split: str = "train",
    conversation_style: str = "sharegpt",
    **load_dataset_kwargs: Any,
) -> MultimodalDataset:
    """Conversations with images: a column of turns and a column of images (one per row, or a list).

    ``conversation_style="sharegpt"`` (torchtune's layout): turns ``{"from": "human"|"gpt"|"system", "value":
    ...}`` in column ``conversations`` and images in column ``image``. ``"openai"``: turns ``{"role": ...,
    "content": ...}`` in column ``messages``, where content may also be a list of ``text`` and ``image_url``
    parts; an ``image`` column is then optional. Each image is a path (relative to ``image_dir``), a URL or a
    ``datasets.Image`` value. Loss goes on the assistant turns only.

    Args:
        model_transform (Callable): the family's model transform (tokenizer and image transform).
        source (str): hub name, builder (``"json"``, ``"parquet"``) with ``data_files``, directory or file.
        column_map (Mapping[str, str] | None): ``{"conversations": ..., "image": ...}`` (``{"messages": ...,
            "image": ...}`` for ``"openai"``) naming your columns.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        packed (bool): must be False: packing is not supported with images.
        image_tag (str | None): the placeholder in the user turns' text that each image replaces (e.g.
            ``"<image>"``); None puts the images before the first user turn's text.
        image_dir (str | Path | None): directory that relative image paths are read from; None reads them
            relative to the working directory (and URLs or stored images need none).
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        conversation_style (str): ``"sharegpt"`` (default, as torchtune) or ``"openai"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ...).

    Returns:
        MultimodalDataset: samples with ``tokens``, ``labels`` and ``encoder_input``.

    Raises:
        ValueError: for ``packed=True``, an unknown style, a missing column; from ``dataset[i]`` for a bad row.
    """
    _refuse_packing(packed, "multimodal_chat_dataset")
    if conversation_style == "sharegpt":
        message_transform = ShareGPTToMessages(
            train_on_input=False, column_map=column_map, new_system_prompt=new_system_prompt, image_dir=image_dir,
            image_tag=image_tag,
        )  # fmt: skip
    elif conversation_style == "openai":
        message_transform = OpenAIToMessages(
            train_on_input=False, column_map=column_map, new_system_prompt=new_system_prompt, image_dir=image_dir,
            image_tag=image_tag,
        )  # fmt: skip
    else:
        raise ValueError(
            f"multimodal_chat_dataset: conversation_style must be 'sharegpt' or 'openai', got {conversation_style!r}."
        )
    return MultimodalDataset(
        source=source, message_transform=message_transform, model_transform=model_transform, filter_fn=filter_fn,
        split=split, **load_dataset_kwargs,
    )  # fmt: skip


def llava_instruct_dataset(
    model_transform: Callable,
    *,
    source: str = "liuhaotian/LLaVA-Instruct-150K",
    image_dir: "str | Path" = "coco/train2017/",
    column_map: Mapping[str, str] | None = None,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    data_files: str = "llava_instruct_150k.json",
    **load_dataset_kwargs: Any,
) -> MultimodalDataset:
    """LLaVA-Instruct-150K (Liu et al., 2023, https://arxiv.org/abs/2304.08485): ShareGPT conversations about COCO
    images, with ``<image>`` in the first user turn where the image goes.

    Download the COCO 2017 train images first (http://images.cocodataset.org/zips/train2017.zip) and unzip them so
    that ``image_dir`` holds the files the ``image`` column names.

    Args:
        model_transform (Callable): the family's model transform.
        source (str): hub name or local source. Default ``"liuhaotian/LLaVA-Instruct-150K"``.
        image_dir (str | Path): directory of the images. Default ``"coco/train2017/"``.
        column_map (Mapping[str, str] | None): ``{"conversations": ..., "image": ...}`` naming your columns.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        packed (bool): must be False: packing is not supported with images.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        data_files (str): the file of the source to read. Default ``"llava_instruct_150k.json"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        MultimodalDataset: samples with ``tokens``, ``labels`` and ``encoder_input``.

    Raises:
        ValueError: for ``packed=True`` or a missing column; from ``dataset[i]`` for a bad row or missing image.
    """
    _refuse_packing(packed, "llava_instruct_dataset")
    message_transform = ShareGPTToMessages(
        train_on_input=False, column_map=column_map, new_system_prompt=new_system_prompt, image_dir=image_dir,
        image_tag="<image>",
    )  # fmt: skip
    return MultimodalDataset(
        source=source, message_transform=message_transform, model_transform=model_transform, filter_fn=filter_fn,
        split=split, data_files=data_files, **load_dataset_kwargs,
    )  # fmt: skip


def the_cauldron_dataset(
    model_transform: Callable,
    *,
    subset: str | None = "orcvqa",
    source: str = "HuggingFaceM4/the_cauldron",
    column_map: Mapping[str, str] | None = None,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> MultimodalDataset:
    """The Cauldron (Laurençon et al., 2024, https://arxiv.org/abs/2405.02246): 50 vision-language datasets in one
    layout, column ``images`` (a list of images) and column ``texts`` (a list of ``{"user", "assistant"}``
    exchanges). All images go before the first user turn's text; loss goes on the answers.

    Args:
        model_transform (Callable): the family's model transform.
        subset (str | None): which of the datasets (``"ai2d"``, ``"chartqa"``, ``"ocrvqa"``, ...), passed to
            ``load_dataset`` as ``name``; the hub source needs one. None for a local source without
            configurations. Default ``"orcvqa"`` (torchtune's default, although the hub's subset is spelled
            ``"ocrvqa"``).
        source (str): hub name or local source. Default ``"HuggingFaceM4/the_cauldron"``.
        column_map (Mapping[str, str] | None): ``{"images": ..., "texts": ...}`` naming your columns.
        new_system_prompt (str | None): prepended system turn (masked).
        packed (bool): must be False: packing is not supported with images.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        MultimodalDataset: samples with ``tokens``, ``labels`` and ``encoder_input``.

    Raises:
        ValueError: for ``packed=True`` or a missing column; from ``dataset[i]`` for a bad row.
    """
    _refuse_packing(packed, "the_cauldron_dataset")
    if subset is not None:
        load_dataset_kwargs["name"] = subset
    message_transform = TheCauldronToMessages(column_map=column_map, new_system_prompt=new_system_prompt)
    return MultimodalDataset(
        source=source, message_transform=message_transform, model_transform=model_transform, filter_fn=filter_fn,
        split=split, **load_dataset_kwargs,
    )  # fmt: skip


def vqa_dataset(
    model_transform: Callable,
    *,
    source: str,
    image_dir: "str | Path | None" = None,
    column_map: Mapping[str, str] | None = None,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> MultimodalDataset:
    """Visual question answering: one image, a question (column ``input``) and an answer (column ``output``).

    The image (column ``image``: a path relative to ``image_dir``, a URL or a ``datasets.Image`` value) goes
    before the question; loss goes on the answer.

    Args:
        model_transform (Callable): the family's model transform.
        source (str): hub name, builder with ``data_files``, directory or file.
        image_dir (str | Path | None): directory that relative image paths are read from.
        column_map (Mapping[str, str] | None): ``{"input": ..., "output": ..., "image": ...}`` naming your columns.
        new_system_prompt (str | None): prepended system turn (masked).
        packed (bool): must be False: packing is not supported with images.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        MultimodalDataset: samples with ``tokens``, ``labels`` and ``encoder_input``.

    Raises:
        ValueError: for ``packed=True`` or a missing column; from ``dataset[i]`` for a bad row or missing image.
    """
    _refuse_packing(packed, "vqa_dataset")
    # the image column is part of the layout: a dataset without it is refused when built, not trained text-only
    column_map = {"image": "image", **(column_map or {})}
    message_transform = InputOutputToMessages(
        column_map=column_map, new_system_prompt=new_system_prompt, image_dir=image_dir
    )
    return MultimodalDataset(
        source=source, message_transform=message_transform, model_transform=model_transform, filter_fn=filter_fn,
        split=split, **load_dataset_kwargs,
    )  # fmt: skip
