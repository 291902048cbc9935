"""Qwen2.5-VL's data side: the image transform (an image to the vision encoder's flattened patches and its grid)
and the model transform (a conversation with images to tokens, loss mask and the encoder's input), equal to what
transformers' ``Qwen2_5_VLProcessor`` with its PIL image processor makes of the same inputs.

An image is resized so both sides are multiples of ``patch_size * merge_size`` (:func:`smart_resize`), normalised,
and cut into ``patch_size`` squares, each repeated ``temporal_patch_size`` times (a still image is a one-frame
video to the encoder). In the text it becomes ``<|vision_start|>``, one ``<|image_pad|>`` per ``merge_size x
merge_size`` group of patches, and ``<|vision_end|>``.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tune.data import ChatTokenizer, Message, Qwen2ChatFormat, Segment, tokenize_with_images, truncate
from tune.models.qwen2_5 import qwen2_5_tokenizer
from tune.utils import get_logger

_log = get_logger(name=__name__)

# CLIP's normalisation (the statistics of OpenAI's CLIP training images), which Qwen2.5-VL's encoder was trained with.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# The pixel budget of the released checkpoints' preprocessor_config.json (Qwen/Qwen2.5-VL-*-Instruct): from 4 to
# 16384 image tokens per image. Fine-tuning usually lowers the maximum to bound memory.
QWEN2_5_VL_MIN_PIXELS = 56 * 56
QWEN2_5_VL_MAX_PIXELS = 28 * 28 * 16384

# Images longer than this many times their width (or wider than their height) are refused, as transformers does.
MAX_ASPECT_RATIO = 200

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"

# The default system prompt of the Qwen2.5-VL (and Qwen2-VL) chat template.
QWEN2_5_VL_DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """The size Qwen2-VL and Qwen2.5-VL resize an image to: both sides multiples of ``factor``, the area within
    ``[min_pixels, max_pixels]``, the aspect ratio kept as closely as that allows. Each side is first rounded to the
    nearest multiple of ``factor`` (Python's ``round``: halves to even); when that area is too large (small), both
    sides are scaled by one factor and rounded down (up) to multiples of ``factor``, never below ``factor``.
    Defaults are those of transformers' ``smart_resize``.

    Args:
        height (int): image height in pixels.
        width (int): image width in pixels.
        factor (int): both sides become multiples of it (``patch_size * merge_size``). Default 28.
        min_pixels (int): the least area. Default 3136 (56 x 56).
        max_pixels (int): the largest area (exceeded only by images so thin that one side stays at ``factor``).
            Default 1003520 (28 x 28 x 1280).

    Returns:
        tuple[int, int]: ``(height, width)`` after resizing.

    Raises:
        ValueError: for a side under 1 pixel, or an aspect ratio over 200 (transformers refuses those too).
    """
    if height < 1 or width < 1:
        raise ValueError(f"the image is {height}x{width} pixels (height x width); an image needs at least one pixel.")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"the image is {height}x{width} pixels (height x width), an aspect ratio of {ratio:.1f}; Qwen2.5-VL takes "
            f"aspect ratios up to {MAX_ASPECT_RATIO} (as transformers' processor does). Crop or pad the image first."
        )
    new_height = round(height / factor) * factor
    new_width = round(width / factor) * factor
    if new_height * new_width > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        new_height = max(factor, math.floor(height / shrink / factor) * factor)
        new_width = max(factor, math.floor(width / shrink / factor) * factor)
    elif new_height * new_width < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        new_height = math.ceil(height * grow / factor) * factor
        new_width = math.ceil(width * grow / factor) * factor
    return new_height, new_width


def _is_pil_image(obj: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # without Pillow nothing can be a PIL image
        return False
    return isinstance(obj, Image.Image)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


class Qwen2_5_VLImageTransform:
    """Turns a PIL image into Qwen2.5-VL's vision-encoder input, as transformers' ``Qwen2VLImageProcessorPil``
    does (and its default ``Qwen2VLImageProcessor`` up to resampling numerics): the image is made RGB (transparency
    composited onto white), resized with Pillow's bicubic filter to :func:`smart_resize`'s size, scaled to [0, 1],
    normalised with ``image_mean``/``image_std``, and cut into patches.

    The patches are ordered so that each ``merge_size x merge_size`` group, which the encoder merges into one image
    token, is contiguous: by group row, group column, then row and column inside the group. Each row holds one patch
    as ``[channel, time, patch row, patch column]`` flattened, the still image repeated ``temporal_patch_size``
    times along time.

    Args:
        min_pixels (int): the least image area after resizing. Default 3136 (56 x 56), the released checkpoints'.
        max_pixels (int): the largest image area after resizing. Default 12845056 (28 x 28 x 16384), the released
            checkpoints'; lower it to bound the image tokens (``max_pixels / 784`` at most) and memory.
        patch_size (int): side of a vision patch in pixels. Default 14.
        temporal_patch_size (int): frames per patch; a still image is repeated that many times. Default 2.
        merge_size (int): side of the square of patches merged into one image token. Default 2.
        image_mean (Sequence[float]): per-channel mean subtracted (RGB). Default CLIP's.
        image_std (Sequence[float]): per-channel standard deviation divided by (RGB). Default CLIP's.

    Raises:
        ValueError: for a non-positive size, ``min_pixels > max_pixels``, or a mean/std that is not 3 numbers
            (std non-zero).
    """

    def __init__(
        self,
        *,
        min_pixels: int = QWEN2_5_VL_MIN_PIXELS,
        max_pixels: int = QWEN2_5_VL_MAX_PIXELS,
        patch_size: int = 14,
        temporal_patch_size: int = 2,
        merge_size: int = 2,
        image_mean: Sequence[float] = OPENAI_CLIP_MEAN,
        image_std: Sequence[float] = OPENAI_CLIP_STD,
    ) -> None:
        for name, value in [
            ("min_pixels", min_pixels),
            ("max_pixels", max_pixels),
            ("patch_size", patch_size),
            ("temporal_patch_size", temporal_patch_size),
            ("merge_size", merge_size),
        ]:
            _check_positive_int(name, value)
        if min_pixels > max_pixels:
            raise ValueError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels}).")
        if len(image_mean) != 3 or len(image_std) != 3 or any(s == 0 for s in image_std):
            raise ValueError(
                f"image_mean and image_std must hold 3 numbers (R, G, B), std non-zero; got {list(image_mean)} and "
                f"{list(image_std)}."
            )
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.patch_size, self.temporal_patch_size, self.merge_size = patch_size, temporal_patch_size, merge_size
        # float32, as transformers normalises a float32 image with float32 statistics
        self.image_mean = torch.tensor([float(m) for m in image_mean], dtype=torch.float32)
        self.image_std = torch.tensor([float(s) for s in image_std], dtype=torch.float32)

    @property
    def patch_dim(self) -> int:
        """Numbers in one row of ``pixel_values``: ``3 * temporal_patch_size * patch_size ** 2`` (1176)."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def resized_size(self, image: Any) -> tuple[int, int]:
        """``(height, width)`` the image is resized to.

        Raises:
            TypeError: if ``image`` is not a PIL image.
            ValueError: as :func:`smart_resize`.
        """
        if not _is_pil_image(image):
            raise TypeError(
                f"an image must be a PIL.Image.Image, got {type(image).__name__}; open files with PIL.Image.open(path)."
            )
        width, height = image.size
        return smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )

    def grid_thw(self, image: Any) -> tuple[int, int, int]:
        """The image's patch grid ``(time, height, width)`` in patches, without processing its pixels.

        Raises:
            TypeError, ValueError: as :meth:`resized_size`.
        """
        height, width = self.resized_size(image)
        return 1, height // self.patch_size, width // self.patch_size

    def num_image_tokens(self, image: Any) -> int:
        """How many ``<|image_pad|>`` tokens the image takes in the text: its patches over ``merge_size ** 2``.

        Raises:
            TypeError, ValueError: as :meth:`resized_size`.
        """
        return math.prod(self.grid_thw(image)) // self.merge_size**2

    def __call__(self, image: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Processes one image.

        Args:
            image (PIL.Image.Image): the image, any mode (converted to RGB).

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``pixel_values`` float32 ``[grid_h * grid_w, patch_dim]`` and
            ``grid_thw`` int64 ``[3]`` (``(1, grid_h, grid_w)``).

        Raises:
            TypeError: if ``image`` is not a PIL image.
            ValueError: as :func:`smart_resize` (an empty image, an aspect ratio over 200).
        """
        from PIL import Image

        height, width = self.resized_size(image)
        rgb = _to_rgb(image).resize((width, height), resample=Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(_as_uint8_array(rgb))  # [h, w, 3]
        # Scaled in float64, then float32, then normalised in float32: the order transformers computes in, so the
        # values are bitwise the same.
        pixels = (pixels.to(torch.float64) * (1 / 255)).to(torch.float32)
        pixels = (pixels - self.image_mean) / self.image_std
        return self._patchify(pixels), torch.tensor([1, height // self.patch_size, width // self.patch_size])

    def _patchify(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[h, w, c]`` normalised pixels -> ``[grid_h * grid_w, c * t * p * p]`` patches, merge groups contiguous."""
        height, width, channels = pixels.shape
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        # [group row, row in group, pixel row, group col, col in group, pixel col, c]
        patches = pixels.view(grid_h // m, m, p, grid_w // m, m, p, channels)
        # -> [group row, group col, row in group, col in group, c, pixel row, pixel col]
        patches = patches.permute(0, 3, 1, 4, 6, 2, 5)
        # a still image fills every frame of the temporal patch: -> [..., c, t, pixel row, pixel col]
        patches = patches.unsqueeze(5).expand(*patches.shape[:5], t, p, p)
        return patches.reshape(grid_h * grid_w, channels * t * p * p)


def _to_rgb(image: Any) -> Any:
    """The image in RGB mode; transparent pixels are composited onto white (a palette image's transparency too)."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _as_uint8_array(image: Any) -> Any:
    import numpy as np

    return np.array(image, dtype=np.uint8)  # a copy: torch.from_numpy wants a writable array


class _Qwen2_5_VLChatFormat(Qwen2ChatFormat):
    """The chat template of ``Qwen/Qwen2.5-VL-7B-Instruct`` (the same as Qwen2-VL's) for text: ChatML with the default
    system prompt "You are a helpful assistant." inserted when the conversation has none, content not stripped,
    and tool results as turns of their own role (``<|im_start|>tool``), where Qwen 2.5's template gathers them into
    a user turn."""

    name = "qwen2_5_vl"

    def __init__(self) -> None:
        super().__init__(QWEN2_5_VL_DEFAULT_SYSTEM_PROMPT)

    def _tool(self, b: Any, messages: Sequence[Message], i: int, end: bool) -> None:
        self._turn(b, i, messages[i].role, messages[i].text_content, end)


class Qwen2_5_VLTransform:
    """Qwen2.5-VL's model transform: a conversation with images to ``tokens``, ``mask`` and ``encoder_input``, the
    tokens those of transformers' ``Qwen2_5_VLProcessor`` on the conversation rendered by the Qwen2.5-VL chat
    template, ``encoder_input`` its ``pixel_values`` and ``image_grid_thw``. It is also the family's tokenizer
    (``encode``, ``decode``, ``tokenize_messages``, the special ids), so a recipe uses it wherever it uses one.

    Each image part of a message (``{"type": "image", "content": PIL.Image.Image}``) becomes ``<|vision_start|>``,
    :meth:`Qwen2_5_VLImageTransform.num_image_tokens` ``<|image_pad|>`` tokens and ``<|vision_end|>``, in place,
    never trained. The text is masked as the text tokenizer masks it (``Message.masked``).

    Truncation: a conversation longer than ``max_seq_len`` is cut there, and the last token becomes EOS (as text is
    cut), but never inside an image: when an image's tokens would not all fit before that EOS, the sequence is cut
    just before its ``<|vision_start|>`` instead (so it may end up shorter than ``max_seq_len``), and that image and
    every later one are dropped with their pixel rows (a warning says so, once). An image is thus either whole in
    ``tokens`` and ``encoder_input``, or absent from both.

    Args:
        tokenizer (ChatTokenizer): the text tokenizer with the Qwen2.5-VL chat format (see
            :func:`qwen2_5_vl_transform`); its own ``max_seq_len`` is not used.
        image_transform (Qwen2_5_VLImageTransform): processes the images.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        add_vision_id (bool): write ``Picture {n}: `` before the n-th image of a conversation, as the chat
            template's ``add_vision_id=True`` does. Default False.

    Raises:
        ValueError: for a non-positive ``max_seq_len``, or a tokenizer without Qwen's vision tokens.
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        image_transform: Qwen2_5_VLImageTransform,
        *,
        max_seq_len: int | None = None,
        add_vision_id: bool = False,
    ) -> None:
        if max_seq_len is not None and (
            isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1
        ):
            raise ValueError(f"max_seq_len must be a positive integer or None, got {max_seq_len!r}.")
        self.tokenizer = tokenizer
        self.image_transform = image_transform
        self.max_seq_len = max_seq_len
        self.add_vision_id = add_vision_id
        self._warned_drop = False
        try:
            self.image_pad_id = tokenizer.tokenizer.token_id(IMAGE_PAD)
            for token in (VISION_START, VISION_END):
                tokenizer.tokenizer.token_id(token)
        except ValueError as e:
            raise ValueError(
                f"{e} Qwen2.5-VL's tokenizer has {VISION_START}, {IMAGE_PAD} and {VISION_END}; use the "
                "tokenizer.json of a Qwen2.5-VL checkpoint."
            ) from None
        self._start = Segment(VISION_START, False, special=True)
        self._pad = Segment(IMAGE_PAD, False, special=True)
        self._end = Segment(VISION_END, False, special=True)

    # ---- the text tokenizer's interface -------------------------------------------------------------------------

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    @property
    def stop_tokens(self) -> list[int]:
        return self.tokenizer.stop_tokens

    @property
    def special_tokens(self) -> dict[str, int]:
        return self.tokenizer.special_tokens

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def truncation_keeps_mask(self) -> bool:
        """Whether the EOS put last by truncation keeps the mask of the token it replaces (no, for Qwen)."""
        return self.tokenizer.truncation_keeps_mask

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes plain text (no chat format), as the text tokenizer does."""
        return self.tokenizer.encode(text, add_bos=add_bos, add_eos=add_eos)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text (special tokens, image tokens included, dropped unless ``skip_special_tokens`` is
        False)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def tokenize_messages(
        self, messages: Sequence[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool]]:
        """Tokens of a conversation, images included as their image tokens, and its loss mask (the pixels are not
        processed: only each image's size is read).

        Args:
            messages (Sequence[Message]): the conversation; parts of type ``"image"`` hold PIL images.
            add_end_tokens (bool): False leaves the conversation open for generation.

        Returns:
            tuple[list[int], list[bool]]: ``(tokens, mask)``; ``mask[i]`` is True where token i gets no loss.
            Truncated to ``max_seq_len`` as the class docstring says.

        Raises:
            TypeError: for an image part that does not hold a PIL image, or messages that are not Message.
            ValueError: for a part that is neither text nor image, an image the resize rule refuses, and what the
                text tokenizer refuses (empty content, an unsupported role).
        """
        tokens, mask, _ = self._tokenize(messages, add_end_tokens)
        return tokens, mask

    def tokenize_messages_batch(
        self, conversations: Sequence[Sequence[Message]], *, add_end_tokens: bool = True
    ) -> list[tuple[list[int], list[bool]]]:
        """:meth:`tokenize_messages` of each conversation."""
        return [self.tokenize_messages(messages, add_end_tokens=add_end_tokens) for messages in conversations]

    # ---- the model transform ------------------------------------------------------------------------------------

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Tokenizes ``sample["messages"]`` and processes its images.

        Args:
            sample (Mapping[str, Any]): holds ``"messages"``, a list of :class:`~tune.data.Message`.
            inference (bool): leave the conversation open for generation (``add_end_tokens=False``).

        Returns:
            dict[str, Any]: the other keys of ``sample``, plus ``tokens`` (list[int]), ``mask`` (list[bool], True =
            no loss) and ``encoder_input``: ``pixel_values`` float32 ``[num_patches, 1176]`` (the images' patches one
            after another) and ``image_grid_thw`` int64 ``[num_images, 3]``; both have 0 rows without images.

        Raises:
            TypeError, ValueError: as :meth:`tokenize_messages`.
        """
        out = {k: v for k, v in sample.items() if k != "messages"}
        out["tokens"], out["mask"], images = self._tokenize(sample["messages"], not inference)
        pixel_values, grids = [], []
        for image in images:
            patches, grid = self.image_transform(image)
            pixel_values.append(patches)
            grids.append(grid)
        if images:
            encoder_input = {"pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.stack(grids)}
        else:
            encoder_input = {
                "pixel_values": torch.zeros(0, self.image_transform.patch_dim),
                "image_grid_thw": torch.zeros(0, 3, dtype=torch.int64),
            }
        out["encoder_input"] = encoder_input
        return out

    def _tokenize(self, messages: Sequence[Message], add_end_tokens: bool) -> tuple[list[int], list[bool], list[Any]]:
        """Tokens, mask and the images left whole in them after truncation."""
        messages = [Message.from_dict(m) if isinstance(m, dict) else m for m in messages]
        images = self._collect_images(messages)
        counts = [self.image_transform.num_image_tokens(image) for image in images]
        tokens, mask, _ = tokenize_with_images(
            self.tokenizer, messages, self._image_segments(counts), add_end_tokens=add_end_tokens
        )
        if self.max_seq_len is None or len(tokens) <= self.max_seq_len:
            return tokens, mask, images
        length, kept = self._cut(tokens, counts, add_end_tokens)
        if kept < len(images) and not self._warned_drop:
            self._warned_drop = True  # once per transform: a dataset would repeat it for every long sample
            factor = self.image_transform.patch_size * self.image_transform.merge_size
            _log.warning(
                f"a conversation was cut to max_seq_len={self.max_seq_len} before its image {kept + 1} "
                f"({counts[kept]} image tokens), which was dropped with every later image. Raise max_seq_len or "
                f"lower max_pixels (an image takes about max_pixels / {factor**2} tokens at most) to keep images. "
                "Logged once."
            )
        eos_mask = None if self.truncation_keeps_mask or not add_end_tokens else True
        tokens = truncate(tokens, length, self.eos_id if add_end_tokens else None)
        mask = truncate(mask, length, eos_mask)
        return tokens, mask, images[:kept]

    def _image_segments(self, counts: list[int]) -> Callable[[int], list[Segment]]:
        def segments(index: int) -> list[Segment]:
            # "Picture n: " is text: it is encoded with the text before it, as the template's output is
            prefix = [Segment(f"Picture {index + 1}: ", False)] if self.add_vision_id else []
            return [*prefix, self._start, *([self._pad] * counts[index]), self._end]

        return segments

    def _cut(self, tokens: list[int], counts: list[int], add_end_tokens: bool) -> tuple[int, int]:
        """Where a too-long sequence is cut, and how many images stay: the first image that does not fit whole
        before the last slot (taken by EOS with ``add_end_tokens``) moves the cut to its ``<|vision_start|>``."""
        limit = self.max_seq_len
        room = limit - 1 if add_end_tokens else limit  # positions left for the conversation's own tokens
        position = 0
        for index, count in enumerate(counts):
            first_pad = tokens.index(self.image_pad_id, position)
            start, end = first_pad - 1, first_pad + count + 1  # <|vision_start|> .. <|vision_end|> inclusive
            if end > room:
                # with EOS the cut keeps one more token, which EOS replaces: the <|vision_start|>
                return min(limit, max(1, start + (1 if add_end_tokens else 0))), index
            position = first_pad + count
        return limit, len(counts)

    def _collect_images(self, messages: Sequence[Message]) -> list[Any]:
        """The image parts' content in order (as :func:`~tune.data.replace_images` collects them), checked."""
        images = []
        for index, message in enumerate(messages):
            if not isinstance(message, Message):
                raise TypeError(f"message {index} must be a Message (or a dict), got {type(message).__name__}.")
            if IMAGE_PAD in message.text_content:
                raise ValueError(
                    f"message {index} ({message.role}) contains the text {IMAGE_PAD!r}, which stands for image "
                    "tokens; give images as {'type': 'image', 'content': PIL.Image.Image} parts instead."
                )
            if not message.contains_media:
                continue
            for part_index, part in enumerate(message.content):
                if part["type"] != "image":
                    continue
                if not _is_pil_image(part["content"]):
                    raise TypeError(
                        f"part {part_index} of message {index} ({message.role}) is an image part holding a "
                        f"{type(part['content']).__name__}; it must hold a PIL.Image.Image (open files with "
                        "PIL.Image.open(path))."
                    )
                images.append(part["content"])
        return images


def qwen2_5_vl_transform(
    path: str,
    merges_file: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: Any = None,
    *,
    min_pixels: int = QWEN2_5_VL_MIN_PIXELS,
    max_pixels: int = QWEN2_5_VL_MAX_PIXELS,
    add_vision_id: bool = False,
    **kwargs: Any,
) -> Qwen2_5_VLTransform:
    """Qwen2.5-VL's model transform: Qwen 2.5's tokenizer with the Qwen2.5-VL chat template (default system prompt
    "You are a helpful assistant.", tool results as ``tool`` turns) and the image transform. Tokens, ``pixel_values``
    and ``image_grid_thw`` equal transformers' ``Qwen2_5_VLProcessor`` output for the same checkpoint files and
    pixel budget.

    Args:
        path (str): ``tokenizer.json`` or its directory; or ``vocab.json`` when ``merges_file`` is given.
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens_path (str | None): a tokenizer.json whose ``added_tokens`` are used with vocab/merges.
        max_seq_len (int | None): conversations are truncated to this many tokens, never inside an image (see
            :class:`Qwen2_5_VLTransform`).
        prompt_template (PromptTemplate | dict | str | None): a prompt template applied to the messages before the
            chat template (a callable, a dict of role -> ``(prepend, append)``, or a dotted path), as in torchtune.
        min_pixels (int): the least image area after resizing. Default 3136, the released checkpoints'.
        max_pixels (int): the largest image area after resizing. Default 12845056, the released checkpoints' (up to
            16384 tokens per image); fine-tuning configs usually lower it.
        add_vision_id (bool): write ``Picture {n}: `` before the n-th image, as the template's ``add_vision_id``.
        **kwargs: torchtune's tokenizer options, as :func:`~tune.models.qwen2_5.qwen2_5_tokenizer` accepts them.

    Returns:
        Qwen2_5_VLTransform: no BOS, EOS and pad ``<|endoftext|>``, stop tokens ``[<|im_end|>, <|endoftext|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for bad tokenizer files or options, a bad prompt template (a chat format's name among them), or
            bad pixel bounds.
    """
    text = qwen2_5_tokenizer(path, merges_file, special_tokens_path, **kwargs)
    end_of_text, im_end = text.special_tokens["<|endoftext|>"], text.special_tokens["<|im_end|>"]
    tokenizer = ChatTokenizer(
        text.tokenizer,
        _Qwen2_5_VLChatFormat(),
        bos_id=None,
        eos_id=end_of_text,
        pad_id=end_of_text,
        stop_tokens=[im_end, end_of_text],
        special_tokens=text.special_tokens,
        prompt_template=prompt_template,
    )
    if hasattr(tokenizer.prompt_template, "render"):  # a chat format named where Qwen 2.5's tokenizer takes one
        raise ValueError(
            f"prompt_template={prompt_template!r} names a chat format; qwen2_5_vl_transform always renders "
            "conversations with the Qwen2.5-VL chat template. Drop prompt_template, or give a prompt template "
            "(a callable on the messages, or a dict of role -> (prepend, append))."
        )
    image_transform = Qwen2_5_VLImageTransform(min_pixels=min_pixels, max_pixels=max_pixels)
    return Qwen2_5_VLTransform(tokenizer, image_transform, max_seq_len=max_seq_len, add_vision_id=add_vision_id)
