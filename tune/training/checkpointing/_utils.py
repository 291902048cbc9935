"""torchtune's checkpointing helpers that user code imports: the model-type names, the formatted file list, the
newest ``epoch_N`` folder, and the classifier-head fix-up before loading a base model's weights."""

import re
import string
import warnings
from collections.abc import Iterable
from enum import Enum
from pathlib import Path

import torch

# torchtune's training.checkpointing._utils also holds the state-dict key names and safe_torch_load
from tune.training.checkpointing._constants import (  # noqa: F401
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    DATALOADER_KEY,
    EPOCHS_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    RNG_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
)
from tune.training.checkpointing._io import safe_torch_load  # noqa: F401


class ModelType(str, Enum):
    """torchtune's model-type names, accepted wherever a checkpointer takes ``model_type``.

    tune looks model types up in ``tune.registry`` by name (case-insensitive), so a plain string (``"LLAMA3_2"``,
    ``"qwen2_5"``) works too and a family added by a plugin needs no member here. A member is a ``str`` equal to
    its lower-case value, so ``ModelType.LLAMA3_2 == "llama3_2"``. Members whose family tune does not ship
    (``CLIP_TEXT``, ``T5_ENCODER``, ``LLAMA3_VISION``) make the checkpointer raise an error that lists the
    registered families. ``REWARD`` (a sequence-classification reward model) is read by
    ``FullModelHFCheckpointer``, which takes the family from ``config.json``'s ``model_type``.
    """

    GEMMA = "gemma"
    GEMMA2 = "gemma2"
    LLAMA2 = "llama2"
    LLAMA3 = "llama3"
    LLAMA3_2 = "llama3_2"
    LLAMA3_VISION = "llama3_vision"
    MISTRAL = "mistral"
    PHI3_MINI = "phi3_mini"
    PHI4 = "phi4"
    REWARD = "reward"
    QWEN2 = "qwen2"
    CLIP_TEXT = "clip_text"
    T5_ENCODER = "t5_encoder"

    def __str__(self) -> str:
        return self.value


class FormattedCheckpointFiles:
    """A numbered list of weight files written as one format string, e.g. ``model-{}-of-{}.safetensors`` with
    ``max_filename="00004"`` for four files.

    Args:
        filename_format (str): a file name with exactly two ``{}`` placeholders: the file's number and the last
            number.
        max_filename (str): the last number as written in the file names, zero padding included (``"00004"``).

    Raises:
        ValueError: if ``filename_format`` does not have exactly two placeholders.
    """

    def __init__(self, filename_format: str, max_filename: str) -> None:
        self.filename_format = filename_format
        self.max_filename = max_filename
        self._validate_filename_format()

    @classmethod
    def from_dict(cls, d: dict) -> "FormattedCheckpointFiles":
        """Builds it from a config mapping ``{"filename_format": ..., "max_filename": ...}``.

        Raises:
            ValueError: if a key is missing or ``max_filename`` is not a string (YAML reads ``00004`` unquoted as 4;
                quote it).
        """
        if "filename_format" not in d or "max_filename" not in d:
            raise ValueError(
                f"checkpoint_files as a mapping needs 'filename_format' and 'max_filename', got {sorted(d)}. "
                "Example: {filename_format: 'model-{}-of-{}.safetensors', max_filename: '00004'}."
            )
        if not isinstance(d["max_filename"], str):
            raise ValueError(
                f"max_filename must be a string (quote it in YAML: '00004'), got {type(d['max_filename']).__name__} "
                f"{d['max_filename']!r}."
            )
        return cls(filename_format=d["filename_format"], max_filename=d["max_filename"])

    def _validate_filename_format(self) -> None:
        fields = [field for _, field, _, _ in string.Formatter().parse(self.filename_format)]
        if sum(field is not None for field in fields) != 2:
            raise ValueError(
                f"filename_format must contain exactly two placeholders (file number, last number), got "
                f"{self.filename_format!r}. Example: 'model-{{}}-of-{{}}.safetensors'."
            )

    def build_checkpoint_filenames(self) -> list[str]:
        """The file names, numbered from 1 to ``max_filename`` with the same zero padding.

        Returns:
            list[str]: e.g. ``["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]``.
        """
        width = len(self.max_filename)
        last = int(self.max_filename)
        return [
            self.filename_format.format(str(number).zfill(width), self.max_filename) for number in range(1, last + 1)
        ]


def get_largest_iter_folder(dir: str | Path, pattern: str = r"^epoch_(\d+)") -> str | None:  # noqa: A002
    """The name of the entry of ``dir`` whose number (the first group of ``pattern``) is largest.

    Unlike :func:`find_latest_checkpoint` this looks at names only, not at whether the checkpoint is complete.

    Args:
        dir (str | Path): the directory to look in.
        pattern (str): a regular expression matched at the start of each name, with one group of digits.
            Default ``^epoch_(\\d+)``.

    Returns:
        str | None: the entry's name (not its path), or None when no name matches.
    """
    regex = re.compile(pattern)
    numbered = []
    for entry in Path(dir).iterdir():
        match = regex.match(entry.name)
        if match:
            numbered.append((int(match.group(1)), entry.name))
    return max(numbered)[1] if numbered else None


def update_state_dict_for_classifier(
    state_dict: dict[str, torch.Tensor],
    model_named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    force_override: bool = False,
) -> None:
    """Prepares a base language model's state dict for a classifier (e.g. a reward model) in place.

    A classifier's ``output`` projects to ``num_classes`` rows where the language model's projects to the
    vocabulary, so when the row counts differ (or ``force_override``) the state dict's ``output.weight`` is replaced
    by the model's freshly initialised one; a checkpoint's ``output.bias`` is dropped with a warning.

    Args:
        state_dict (dict[str, torch.Tensor]): the state dict about to be loaded; changed in place.
        model_named_parameters (Iterable[tuple[str, torch.nn.Parameter]]): ``model.named_parameters()``.
        force_override (bool): replace ``output.weight`` even when the shapes agree. Default False.

    Raises:
        AssertionError: if ``state_dict`` or the model has no ``output.weight``.
    """
    model_output = dict(model_named_parameters).get("output.weight")
    if "output.weight" not in state_dict:
        raise AssertionError("The state dict has no output.weight; expected a model with an output projection.")
    if model_output is None:
        raise AssertionError("The model has no parameter output.weight; expected a classifier with an output head.")
    if "output.bias" in state_dict:
        warnings.warn("The state dict's output.bias is not used by the classifier and is dropped.", stacklevel=2)
        del state_dict["output.bias"]
    if force_override or state_dict["output.weight"].shape[0] != model_output.shape[0]:
        state_dict["output.weight"] = model_output
