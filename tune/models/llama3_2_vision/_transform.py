"""Llama 3.2 Vision's model transform: the Llama 3 tokenizer with an ``<|image|>`` token per image, CLIP's tiling
image transform, and the text-to-image cross-attention masks, in one callable that recipes also use as the
tokenizer."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tune.data import HuggingFaceBaseTokenizer, Message, Segment, tokenize_with_images, truncate
from tune.models.clip import CLIPImageTransform
from tune.models.llama3 import Llama3Tokenizer, llama3_special_tokens, llama3_tokenizer
from tune.modules.transforms import VisionCrossAttentionMask

IMAGE_TOKEN = "<|image|>"
# Llama 3.2 Vision's <|image|> follows the 256 special tokens of Llama 3 (id 128256 after the 128000 ranks)
_IMAGE_OFFSET = 256
# CLIP's normalisation, which Llama 3.2 Vision's encoder was trained with
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PATCH_SIZE = 14
_IMAGE_SEGMENTS = (Segment(IMAGE_TOKEN, False, special=True),)


def _image_segments(index: int) -> Sequence[Segment]:
    return _IMAGE_SEGMENTS


class Llama3VisionTransform:
    """Tokens, loss mask, image tiles and cross-attention masks of a conversation with images (torchtune's class);
    also the tokenizer of a Llama 3.2 Vision run (``encode``, ``decode``, ``tokenize_messages``, special ids).

    Each image part of a message becomes one ``<|image|>`` token where it stands, and its tiles an entry of
    ``encoder_input``. Text is laid out as the Llama 3 tokenizer lays it out (torchtune's layout by default, each
    text part stripped). Image tokens are never trained on; torchtune gives them their message's mask instead, which
    differs only for images in trained turns. A conversation cut at ``max_seq_len`` keeps the images whose token
    survived (torchtune raises instead).

    Args:
        path (str): Llama 3's ``tokenizer.model`` (tiktoken), or a ``tokenizer.json`` holding ``<|image|>``.
        tile_size (int): side of the image tiles in pixels (560 for the Instruct weights, 448 for the base ones).
        patch_size (int): side of the vision encoder's patches (14); ``tile_size`` must be a multiple of it.
        max_num_tiles (int): most tiles per image. Default 4.
        special_tokens_path (str | None): a Hugging Face ``tokenizer.json`` whose ``added_tokens`` (with
            ``<|image|>``) replace the built-in special tokens. Default None: Llama 3's, with ``<|image|>`` after
            them (id 128256 with the real vocabulary).
        max_seq_len (int | None): conversations are cut to this many tokens. Default None.
        image_mean (tuple[float, float, float] | None): per-channel mean for normalising images. Default None.
        image_std (tuple[float, float, float] | None): per-channel standard deviation. Default None.
        prompt_template (PromptTemplate | str | None): as for :func:`~tune.models.llama3.llama3_tokenizer`.

    Raises:
        ValueError: for sizes that are not positive integers, a ``tile_size`` that is not a multiple of
            ``patch_size``, or special tokens without ``<|image|>``.
        FileNotFoundError: if a tokenizer file does not exist.

    Example:
        >>> transform = Llama3VisionTransform("tokenizer.model", tile_size=560, patch_size=14)
        >>> out = transform({"messages": [Message("user", [{"type": "image", "content": image},
        ...                                               {"type": "text", "content": "What is this?"}])]})
        >>> out["encoder_input"]["images"][0].shape  # a landscape image: one row of two tiles
        torch.Size([2, 3, 560, 560])
    """

    def __init__(
        self,
        path: str,
        *,
        tile_size: int,
        patch_size: int,
        max_num_tiles: int = 4,
        special_tokens_path: str | None = None,
        max_seq_len: int | None = None,
        image_mean: tuple[float, float, float] | None = None,
        image_std: tuple[float, float, float] | None = None,
        prompt_template: Any = None,
    ) -> None:
        for name, value in (("tile_size", tile_size), ("patch_size", patch_size), ("max_num_tiles", max_num_tiles)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if tile_size % patch_size:
            raise ValueError(
                f"tile_size ({tile_size}) must be a multiple of patch_size ({patch_size}): the vision encoder cuts "
                "each tile into patch_size x patch_size patches."
            )
        self.tokenizer = _llama3_tokenizer_with_image(path, special_tokens_path, max_seq_len, prompt_template)
        self.image_id = self.tokenizer.special_tokens[IMAGE_TOKEN]
        # float32 tiles, as the Hugging Face processor returns (torchtune's default is bfloat16); the model casts
        self.transform_image = CLIPImageTransform(
            image_mean=image_mean,
            image_std=image_std,
            tile_size=tile_size,
            possible_resolutions=None,
            max_num_tiles=max_num_tiles,
            dtype=torch.float32,
            resample="bilinear",
            resize_to_max_canvas=False,
        )
        self.xattn_mask = VisionCrossAttentionMask(
            tile_size=tile_size, patch_size=patch_size, image_token_id=self.image_id
        )
        self.max_num_tiles = max_num_tiles
        # image embeddings per image at most: every tile's patches plus its CLS embedding
        self.image_seq_len = max_num_tiles * (self.xattn_mask.patches_per_tile + 1)
        self.prompt_template = prompt_template
        self.bos_id, self.eos_id, self.pad_id = self.tokenizer.bos_id, self.tokenizer.eos_id, self.tokenizer.pad_id
        self.stop_tokens = list(self.tokenizer.stop_tokens)
        self.special_tokens = self.tokenizer.special_tokens

    @property
    def max_seq_len(self) -> int | None:
        """The length conversations are cut to (None: not cut)."""
        return self.tokenizer.max_seq_len

    @max_seq_len.setter
    def max_seq_len(self, value: int | None) -> None:
        self.tokenizer.max_seq_len = value

    @property
    def vocab_size(self) -> int:
        """Token ids the text tokenizer knows (BPE ranks plus special tokens, ``<|image|>`` included)."""
        return self.tokenizer.vocab_size

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes plain text (special-token strings in it are ordinary text).

        Args:
            text (str): the text.
            add_bos (bool): prepend ``<|begin_of_text|>``.
            add_eos (bool): append ``<|end_of_text|>``.

        Returns:
            list[int]: token ids.
        """
        return self.tokenizer.encode(text, add_bos=add_bos, add_eos=add_eos)

    def decode(self, token_ids: Sequence[int], truncate_at_eos: bool = True, skip_special_tokens: bool = True) -> str:
        """Decodes ids to text.

        Args:
            token_ids (Sequence[int]): the ids.
            truncate_at_eos (bool): stop at the first ``<|end_of_text|>``. Default True.
            skip_special_tokens (bool): leave special tokens out of the text. Default True.

        Returns:
            str: the text.
        """
        ids = [int(i) for i in token_ids]
        if truncate_at_eos and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def tokenize_messages(
        self, messages: Sequence[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool]]:
        """Tokens and loss mask of a conversation, with an ``<|image|>`` token for each image part.

        Args:
            messages (Sequence[Message]): the conversation.
            add_end_tokens (bool): False leaves it open for generation.

        Returns:
            tuple[list[int], list[bool]]: ``(tokens, mask)``; ``mask[i]`` is True where token i gets no loss. Cut
            to ``max_seq_len`` as the Llama 3 tokenizer cuts.

        Raises:
            ValueError: for a conversation the tokenizer refuses (an empty message, an unknown role or part type).
        """
        tokens, mask, _ = self._tokenize(messages, add_end_tokens)
        return tokens, mask

    def _tokenize(self, messages: Sequence[Message], add_end_tokens: bool) -> tuple[list[int], list[bool], list]:
        # torchtune strips each text part of a message: so does the layout around the images
        tokens, mask, images = tokenize_with_images(
            self.tokenizer, messages, _image_segments, add_end_tokens=add_end_tokens, strip_text=True
        )
        max_seq_len = self.tokenizer.max_seq_len
        if max_seq_len is not None and len(tokens) > max_seq_len:
            eos_mask = None if self.tokenizer.truncation_keeps_mask or not add_end_tokens else True
            tokens = truncate(tokens, max_seq_len, self.eos_id if add_end_tokens else None)
            mask = truncate(mask, max_seq_len, eos_mask)
            # images whose token was cut off are dropped with it
            images = images[: tokens.count(self.image_id)]
        return tokens, mask, images

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Tokenises ``sample["messages"]`` and tiles their images.

        Args:
            sample (Mapping[str, Any]): holds ``"messages"``, a list of :class:`~tune.data.Message` whose parts may
                be ``{"type": "image", "content": PIL.Image.Image}`` (or a ``[C, H, W]`` tensor).
            inference (bool): leave the conversation open for generation. Default False.

        Returns:
            dict[str, Any]: the sample's other keys, plus ``tokens`` (list[int]), ``mask`` (list[bool], True = no
            loss), ``encoder_input``: ``{"images": [n_tiles, 3, tile_size, tile_size] float32 tensor per image,
            "aspect_ratio": [2] int64 tensor per image (tile rows, tile columns)}``, and ``encoder_mask``: per
            image a ``[len(tokens), n_tiles * (patches_per_tile + 1)]`` bool tensor (see
            :class:`~tune.modules.transforms.VisionCrossAttentionMask`).

        Raises:
            TypeError: for an image that is neither a PIL image nor a tensor (its index is given).
            ValueError: as :meth:`tokenize_messages`, or for an image tensor of the wrong shape.
        """
        tokens, mask, images = self._tokenize(sample["messages"], not inference)
        encoder_input: dict[str, list[torch.Tensor]] = {"images": [], "aspect_ratio": []}
        for index, image in enumerate(images):
            try:
                tiled = self.transform_image({"image": image}, inference=inference)
            except (TypeError, ValueError) as err:
                raise type(err)(f"image {index} of the sample: {err}") from None
            encoder_input["images"].append(tiled["image"])
            encoder_input["aspect_ratio"].append(tiled["aspect_ratio"])
        out = {key: value for key, value in sample.items() if key != "messages"}
        out.update(tokens=tokens, mask=mask, encoder_input=encoder_input)
        return self.xattn_mask(out, inference=inference)


def _llama3_tokenizer_with_image(
    path: str, special_tokens_path: str | None, max_seq_len: int | None, prompt_template: Any
) -> Llama3Tokenizer:
    """The Llama 3 tokenizer with ``<|image|>`` among its special tokens (Llama 3's own 256 are unchanged)."""
    file = Path(path).expanduser()
    if special_tokens_path is None and file.is_file() and file.suffix != ".json":
        # a tiktoken file: Llama 3's special tokens follow its ranks (one per non-blank line), <|image|> after them
        num_ranks = sum(1 for line in file.read_bytes().splitlines() if line.strip())
        special = llama3_special_tokens(num_ranks)
        special[IMAGE_TOKEN] = num_ranks + _IMAGE_OFFSET
        return Llama3Tokenizer(path, special, max_seq_len, prompt_template)
    tokenizer = llama3_tokenizer(path, special_tokens_path, max_seq_len, prompt_template)
    if isinstance(tokenizer.tokenizer, HuggingFaceBaseTokenizer):
        try:
            tokenizer.special_tokens[IMAGE_TOKEN] = tokenizer.tokenizer.token_id(IMAGE_TOKEN)
        except ValueError:
            raise ValueError(
                f"{path} has no {IMAGE_TOKEN} token: pass the tokenizer.json (or original/tokenizer.model) of a "
                "Llama 3.2 Vision checkpoint."
            ) from None
    elif IMAGE_TOKEN not in tokenizer.special_tokens:
        raise ValueError(
            f"special_tokens_path {special_tokens_path!r} lists no {IMAGE_TOKEN} token: pass the tokenizer.json of a "
            "Llama 3.2 Vision checkpoint, or leave special_tokens_path unset."
        )
    return tokenizer


def llama3_2_vision_transform(
    path: str,
    max_seq_len: int = 8192,
    image_size: int = 560,
    special_tokens_path: str | None = None,
    prompt_template: Any = None,
) -> Llama3VisionTransform:
    """Llama 3.2 Vision's model transform: 14-pixel patches, at most 4 tiles per image, CLIP's normalisation.

    Args:
        path (str): Llama 3's ``tokenizer.model`` (``original/tokenizer.model`` in the Hugging Face repository), or
            the repository's ``tokenizer.json``.
        max_seq_len (int): conversations are cut to this many tokens. Default 8192.
        image_size (int): side of the tiles: 560 for the Instruct weights (default), 448 for the base ones; a
            multiple of 14.
        special_tokens_path (str | None): a Hugging Face ``tokenizer.json`` whose special tokens replace the
            built-in ones. Default None.
        prompt_template (PromptTemplate | dict | str | None): as for :func:`~tune.models.llama3.llama3_tokenizer`.
            Default None: torchtune's Llama 3 layout.

    Returns:
        Llama3VisionTransform: the transform.

    Raises:
        ValueError: if ``image_size`` is not a positive multiple of 14, or as :class:`Llama3VisionTransform`.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1 or image_size % _PATCH_SIZE:
        raise ValueError(
            f"image_size must be a positive multiple of the patch size {_PATCH_SIZE} (560 for Llama 3.2 Vision "
            f"Instruct, 448 for the base model), got {image_size!r}."
        )
    return Llama3VisionTransform(
        path,
        tile_size=image_size,
        patch_size=_PATCH_SIZE,
        max_num_tiles=4,
        special_tokens_path=special_tokens_path,
        max_seq_len=max_seq_len,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        prompt_template=prompt_template,
    )
