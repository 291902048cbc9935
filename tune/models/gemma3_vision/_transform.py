"""Gemma 3's image transform and model transform: conversations with images -> tokens, loss mask and pixels.

The image transform does what transformers' ``Gemma3ImageProcessor`` does with the releases' settings: RGB (an
alpha channel composited onto white), a resize of the whole image to ``image_size`` x ``image_size`` with PIL's
bilinear filter (the aspect ratio is not kept), pixels scaled to [0, 1] and normalised with mean and std 0.5.
Pan-and-scan (extra crops of very wide or tall images, off by default in ``Gemma3Processor`` too) is not done.

The model transform renders a conversation with tune's Gemma 3 chat format and puts, where each image part was,
what ``Gemma3Processor`` makes of the chat template's ``<start_of_image>``: ``"\\n\\n"``, ``<start_of_image>``,
``tokens_per_image`` image tokens, ``<end_of_image>``, ``"\\n\\n"``. Text parts of a message with images are
stripped, as the template's ``trim`` does.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tune.data import Message, PromptTemplate, Segment, tokenize_with_images, truncate
from tune.data._tokenizers._chat import resolve_prompt_template
from tune.models.gemma import GemmaTokenizer
from tune.models.gemma3 import gemma3_tokenizer
from tune.models.gemma3_vision._component_builders import IMAGE_TOKEN_ID
from tune.models.gemma3_vision._model import IMAGES_KEY

BOI_TOKEN, EOI_TOKEN = "<start_of_image>", "<end_of_image>"
# what Gemma3Processor puts either side of an image's tokens
_IMAGE_MARGIN = "\n\n"


def _pil_image_module():
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("Gemma 3's image transform needs the package `pillow`. Run: pip install pillow") from err
    return Image


class Gemma3ImageTransform:
    """One image -> Gemma 3's pixel values: RGB, resized to ``image_size`` squared (PIL bilinear), normalised.

    Args:
        image_size (int): side of the output in pixels. Default 896.
        image_mean (Sequence[float]): per-channel mean subtracted after scaling to [0, 1]. Default 0.5 each.
        image_std (Sequence[float]): per-channel standard deviation divided by. Default 0.5 each.

    Raises:
        ValueError: for a non-positive ``image_size`` or means and deviations that are not three each.
    """

    def __init__(
        self,
        image_size: int = 896,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
    ) -> None:
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_size must be a positive integer, got {image_size!r}.")
        if len(image_mean) != 3 or len(image_std) != 3:
            raise ValueError(f"image_mean and image_std need 3 values (RGB), got {image_mean!r} and {image_std!r}.")
        self.image_size = image_size
        self.image_mean = torch.tensor(image_mean, dtype=torch.float32)[:, None, None]
        self.image_std = torch.tensor(image_std, dtype=torch.float32)[:, None, None]

    def __call__(self, image: Any) -> torch.Tensor:
        """Transforms one image.

        Args:
            image (PIL.Image.Image): the image, in any mode PIL converts to RGB.

        Returns:
            torch.Tensor: [3, image_size, image_size] float32.

        Raises:
            TypeError: for something other than a PIL image.
        """
        pil = _pil_image_module()
        if not isinstance(image, pil.Image):
            raise TypeError(
                f"Gemma 3's image transform takes PIL images, got {type(image).__name__}; load images with "
                "tune.data.load_image."
            )
        rgb = _to_rgb(image, pil)
        resized = rgb.resize((self.image_size, self.image_size), resample=pil.Resampling.BILINEAR)
        pixels = torch.from_numpy(np.asarray(resized, dtype=np.uint8).copy()).permute(2, 0, 1)  # [3, H, W] uint8
        scaled = (pixels.double() / 255.0).float()  # as the processor: float64 rescale, stored as float32
        return (scaled - self.image_mean) / self.image_std


def _to_rgb(image: Any, pil: Any) -> Any:
    # transparent pixels become white, as transformers' convert_to_rgb does
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = pil.new("RGBA", rgba.size, (255, 255, 255, 255))
        return pil.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


class Gemma3VisionTransform:
    """Gemma 3's model transform: a sample with ``messages`` (image parts holding PIL images) -> tokens, loss mask
    and ``encoder_input={"images": Tensor[n_images, 3, H, W]}``; also the family's text tokenizer.

    Truncation to ``max_seq_len`` never cuts through an image: when the cut would fall inside an image's tokens
    (``<start_of_image>`` to ``<end_of_image>``, or on its last token when EOS replaces the last one), the sample
    is cut just before that image's ``<start_of_image>`` instead, so it comes out shorter than ``max_seq_len``;
    that image and the ones after it are dropped from ``encoder_input``.

    Args:
        tokenizer (GemmaTokenizer): the Gemma 3 text tokenizer (``tune.models.gemma3.gemma3_tokenizer``); it must
            hold ``<start_of_image>`` and ``<end_of_image>``.
        image_transform (Gemma3ImageTransform): pixels of one image.
        tokens_per_image (int): image tokens per image (``mm_tokens_per_image``). Default 256.
        image_token_id (int): the image token (``image_token_index``). Default 262144.
        max_seq_len (int | None): samples are cut to this many tokens when set. Default None.

    Raises:
        ValueError: if the tokenizer lacks the image markers, or for a non-positive ``tokens_per_image``.
    """

    def __init__(
        self,
        tokenizer: GemmaTokenizer,
        image_transform: Gemma3ImageTransform,
        *,
        tokens_per_image: int = 256,
        image_token_id: int = IMAGE_TOKEN_ID,
        max_seq_len: int | None = None,
    ) -> None:
        if not isinstance(tokens_per_image, int) or tokens_per_image < 1:
            raise ValueError(f"tokens_per_image must be a positive integer, got {tokens_per_image!r}.")
        if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 1):
            raise ValueError(f"max_seq_len must be a positive integer or None, got {max_seq_len!r}.")
        try:
            self.boi_id = tokenizer.tokenizer.token_id(BOI_TOKEN)
            self.eoi_id = tokenizer.tokenizer.token_id(EOI_TOKEN)
        except ValueError as err:
            raise ValueError(
                f"The tokenizer has no {BOI_TOKEN} / {EOI_TOKEN}: is it the tokenizer.model of a Gemma 3 release "
                f"with images (4B, 12B, 27B)? {err}"
            ) from err
        self.text_tokenizer = tokenizer
        self.image_transform = image_transform
        self.tokens_per_image = tokens_per_image
        self.image_token_id = image_token_id
        self.max_seq_len = max_seq_len
        # the text tokenizer never cuts: this transform cuts around the images itself
        self.text_tokenizer.max_seq_len = None

    # --- the text tokenizer's interface ---

    @property
    def bos_id(self) -> int:
        return self.text_tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        return self.text_tokenizer.eos_id

    @property
    def pad_id(self) -> int:
        return self.text_tokenizer.pad_id

    @property
    def stop_tokens(self) -> list[int]:
        return self.text_tokenizer.stop_tokens

    @property
    def special_tokens(self) -> dict[str, int]:
        return {
            **self.text_tokenizer.special_tokens,
            BOI_TOKEN: self.boi_id,
            EOI_TOKEN: self.eoi_id,
            "<image_soft_token>": self.image_token_id,
        }

    @property
    def vocab_size(self) -> int:
        return self.text_tokenizer.vocab_size

    @property
    def truncation_keeps_mask(self) -> bool:
        return self.text_tokenizer.truncation_keeps_mask

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes plain text (no chat format), as the text tokenizer."""
        return self.text_tokenizer.encode(text, add_bos=add_bos, add_eos=add_eos)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text; image tokens are left out."""
        kept = [token for token in token_ids if token != self.image_token_id]
        return self.text_tokenizer.decode(kept, skip_special_tokens=skip_special_tokens)

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        """The chat format's segments of a text-only conversation (as the text tokenizer)."""
        return self.text_tokenizer.render(messages, add_end_tokens=add_end_tokens)

    # --- conversations with images ---

    def _image_segments(self, index: int) -> list[Segment]:
        # the image tokens are put in after encoding: <image_soft_token> is outside the SentencePiece vocabulary
        return [
            Segment(_IMAGE_MARGIN, trainable=False),
            Segment(BOI_TOKEN, trainable=False, special=True),
            Segment(EOI_TOKEN, trainable=False, special=True),
            Segment(_IMAGE_MARGIN, trainable=False),
        ]

    def tokenize_with_images(
        self, messages: Sequence[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool], list[Any]]:
        """Tokens, loss mask and the images that are kept, cut to ``max_seq_len`` between images.

        Args:
            messages (Sequence[Message]): the conversation; image parts hold PIL images.
            add_end_tokens (bool): False leaves the conversation open for generation.

        Returns:
            tuple[list[int], list[bool], list[Any]]: ``(tokens, mask, images)``; ``mask[i]`` True where token i
            gets no loss (image tokens never get one); the images whose tokens are in ``tokens``, in order.

        Raises:
            ValueError: for text that holds ``<start_of_image>`` itself, and as the text tokenizer.
        """
        tokens, mask, images = tokenize_with_images(
            self.text_tokenizer, messages, self._image_segments, add_end_tokens=add_end_tokens, strip_text=True
        )
        starts = [i for i, token in enumerate(tokens) if token == self.boi_id]
        if len(starts) != len(images):
            raise ValueError(
                f"The conversation has {len(images)} image part(s) but its tokens hold {len(starts)} {BOI_TOKEN}: "
                f"remove the text {BOI_TOKEN!r} from the messages (images go in as image parts)."
            )
        # [..., boi, eoi, ...] -> [..., boi, image x N, eoi, ...]
        expanded, expanded_mask, spans = [], [], []
        previous = 0
        for start in starts:
            expanded += tokens[previous : start + 1]
            expanded_mask += mask[previous : start + 1]
            begin = len(expanded) - 1
            expanded += [self.image_token_id] * self.tokens_per_image
            expanded_mask += [True] * self.tokens_per_image
            spans.append((begin, len(expanded) + 1))  # boi .. eoi inclusive
            previous = start + 1
        expanded += tokens[previous:]
        expanded_mask += mask[previous:]
        return self._truncate(expanded, expanded_mask, images, spans, add_end_tokens)

    def _truncate(
        self,
        tokens: list[int],
        mask: list[bool],
        images: list[Any],
        spans: list[tuple[int, int]],
        add_end_tokens: bool,
    ) -> tuple[list[int], list[bool], list[Any]]:
        if self.max_seq_len is None or len(tokens) <= self.max_seq_len:
            return tokens, mask, images
        cut = self.max_seq_len
        # the tokens kept as they are: all but the last when EOS replaces it
        unchanged = cut - 1 if add_end_tokens else cut
        kept = [span for span in spans if span[1] <= unchanged]
        if len(kept) < len(spans) and spans[len(kept)][0] < cut:
            cut = spans[len(kept)][0]  # just before the image the cut would go through
        eos = self.eos_id if add_end_tokens else None
        forced_eos_mask = None if self.truncation_keeps_mask or not add_end_tokens else True
        tokens = truncate(tokens[: cut + 1], cut, eos) if cut < len(tokens) else tokens
        mask = truncate(mask[: cut + 1], cut, forced_eos_mask) if cut < len(mask) else mask
        return tokens, mask, images[: len(kept)]

    def tokenize_messages(
        self, messages: Sequence[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool]]:
        """Tokens and loss mask of a conversation, with each image's tokens where its image part is (see
        :meth:`tokenize_with_images`; the images themselves are not returned).

        Raises:
            ValueError: as :meth:`tokenize_with_images`.
        """
        tokens, mask, _ = self.tokenize_with_images(messages, add_end_tokens=add_end_tokens)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Tokenizes ``sample["messages"]`` and transforms its images.

        Args:
            sample (Mapping[str, Any]): holds ``"messages"``, a list of :class:`~tune.data.Message`.
            inference (bool): leave the conversation open for generation (``add_end_tokens=False``).

        Returns:
            dict[str, Any]: the other keys of ``sample``, plus ``tokens``, ``mask`` and
            ``encoder_input={"images": Tensor[n_images, 3, image_size, image_size]}`` (``n_images`` may be 0).

        Raises:
            ValueError: as :meth:`tokenize_with_images`.
            TypeError: for an image part that does not hold a PIL image.
        """
        out = {key: value for key, value in sample.items() if key != "messages"}
        tokens, mask, images = self.tokenize_with_images(sample["messages"], add_end_tokens=not inference)
        size = self.image_transform.image_size
        pixels = [self.image_transform(image) for image in images]
        out["tokens"], out["mask"] = tokens, mask
        out["encoder_input"] = {IMAGES_KEY: torch.stack(pixels) if pixels else torch.zeros(0, 3, size, size)}
        return out


def gemma3_vision_transform(
    path: str,
    *,
    max_seq_len: int | None = None,
    image_size: int = 896,
    tokens_per_image: int = 256,
    image_token_id: int = IMAGE_TOKEN_ID,
    prompt_template: "PromptTemplate | str | None" = None,
) -> Gemma3VisionTransform:
    """Gemma 3's model transform for conversations with images (see :class:`Gemma3VisionTransform`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma 3 release with images (4B, 12B, 27B).
        max_seq_len (int | None): samples are cut to this many tokens (never through an image). Default None.
        image_size (int): side of the images given to the model (the vision config's ``image_size``). Default 896.
        tokens_per_image (int): image tokens per image (``mm_tokens_per_image``). Default 256.
        image_token_id (int): the image token (``image_token_index``; in the releases the first id after the
            SentencePiece vocabulary, added by ``tokenizer.json``). Default 262144.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages before the chat
            format (Gemma 3's chat template, ``tune.data.Gemma2ChatFormat``, is always used). Default None.

    Returns:
        Gemma3VisionTransform: the transform; also the family's text tokenizer.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the tokenizer lacks Gemma 3's turn or image markers, or for bad sizes.
    """
    tokenizer = gemma3_tokenizer(path)
    if prompt_template is not None:
        # a template on top of Gemma 3's chat format (gemma3_tokenizer's own argument picks the format instead)
        tokenizer.prompt_template = resolve_prompt_template(prompt_template)
    return Gemma3VisionTransform(
        tokenizer,
        Gemma3ImageTransform(image_size),
        tokens_per_image=tokens_per_image,
        image_token_id=image_token_id,
        max_seq_len=max_seq_len,
    )
