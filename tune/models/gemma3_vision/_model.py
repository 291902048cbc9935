"""Gemma 3 with images: the multimodal projector and the model that puts image vectors into the language model.

Each image (896 x 896 in the releases) is encoded into 64 x 64 patch vectors by SigLIP, average-pooled down to
``mm_tokens_per_image`` (256) vectors, RMS-normalised in Gemma's ``1 + weight`` form and projected by a matrix into
the language model's width. The prompt holds that many image tokens per image (``image_token_index``, between the
begin- and end-of-image tokens the processor adds); their embeddings, after Gemma's ``sqrt(embed_dim)`` scaling of
the token embeddings, are replaced by the projected image vectors, image after image, so the image vectors
themselves are not scaled. Attention is causal, except that the tokens of one image attend to each other in both
directions; on the sliding-window layers the window still bounds how far back a query looks.
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules import DecoderWrapper, RMSNorm, TransformerDecoder
from tune.modules.vision import SiglipVisionEncoder

# The key of the images in ``encoder_input`` (the model transform's and the collate's layout).
IMAGES_KEY = "images"


class Gemma3MultiModalProjector(nn.Module):
    """Image patches -> ``tokens_per_image`` vectors in the language model's width.

    The patch grid is average-pooled (square windows, no overlap), normalised by an RMSNorm with Gemma's
    ``1 + weight`` scale, and multiplied by ``projection`` [vision_dim, text_dim] (a plain matrix, as in the
    checkpoints, not an ``nn.Linear``).

    Args:
        vision_dim (int): width of the vision encoder's patch vectors.
        text_dim (int): width of the language model.
        patches_per_side (int): the vision encoder's patch grid is ``patches_per_side`` squared.
        tokens_per_image (int): vectors per image; a square whose side divides ``patches_per_side``.
        norm_eps (float): RMSNorm epsilon (the vision config's ``layer_norm_eps``). Default 1e-6.

    Raises:
        ValueError: if ``tokens_per_image`` is not a square whose side divides ``patches_per_side``.
    """

    def __init__(
        self, *, vision_dim: int, text_dim: int, patches_per_side: int, tokens_per_image: int, norm_eps: float = 1e-6
    ) -> None:
        super().__init__()
        tokens_per_side = round(tokens_per_image**0.5)
        if tokens_per_side**2 != tokens_per_image or patches_per_side % tokens_per_side:
            raise ValueError(
                f"mm_tokens_per_image ({tokens_per_image}) must be a square whose side divides the {patches_per_side} "
                "patches per side of an image."
            )
        self.patches_per_side = patches_per_side
        self.tokens_per_image = tokens_per_image
        self.kernel_size = patches_per_side // tokens_per_side
        self.norm = RMSNorm(vision_dim, eps=norm_eps, add_unit_offset=True)
        self.projection = nn.Parameter(torch.zeros(vision_dim, text_dim))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[n_images, patches_per_side**2, vision_dim] -> [n_images, tokens_per_image, text_dim]."""
        n, _, dim = patches.shape
        grid = patches.transpose(1, 2).reshape(n, dim, self.patches_per_side, self.patches_per_side)
        pooled = F.avg_pool2d(grid, kernel_size=self.kernel_size, stride=self.kernel_size)
        pooled = pooled.flatten(2).transpose(1, 2)  # [n, tokens_per_image, vision_dim], row-major
        return torch.matmul(self.norm(pooled), self.projection).type_as(patches)


class Gemma3VisionLanguageModel(DecoderWrapper, nn.Module):
    """Gemma 3 with images: a vision encoder and projector whose outputs replace the image tokens' embeddings.

    It has the interface every vision-language model in tune shares, so the recipes train it like a text model:
    ``model(tokens, mask=..., encoder_input={"images": ...}, input_pos=...)`` returns what the language model
    returns, and the language model's output settings and KV-cache methods (``skip_output_layer``, ``output``,
    ``tok_embeddings``, ``set_num_output_chunks``, ``setup_caches``, ...) are reached through this model.

    Generation with a KV cache: pass the images with the prompt (the first call after ``setup_caches`` or
    ``reset_caches``), which holds every image token, then the new tokens one call at a time without
    ``encoder_input``. An image whose tokens are split over two calls attends causally within itself, unlike the
    model trained on whole images.

    The number of image tokens in ``tokens`` is checked against the images when ``tokens`` is on the CPU, where
    counting them costs nothing. On an accelerator counting would wait for the device in every step, so it is
    skipped unless ``check_image_tokens`` is set to True (for debugging a data pipeline); the model transform
    (``gemma3_vision_transform``) always writes exactly ``mm_tokens_per_image`` image tokens per image. Without
    the check, surplus image tokens take the last image vector and missing ones leave images unused.

    Args:
        encoder (SiglipVisionEncoder): images -> patch vectors.
        projector (Gemma3MultiModalProjector): patch vectors -> image-token embeddings (the fusion part).
        decoder (TransformerDecoder): the Gemma 3 language model.
        image_token_id (int): the placeholder token each image vector replaces (``image_token_index``).
    """

    def __init__(
        self,
        *,
        encoder: SiglipVisionEncoder,
        projector: Gemma3MultiModalProjector,
        decoder: TransformerDecoder,
        image_token_id: int,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector
        self.decoder = decoder
        self.image_token_id = image_token_id
        self.check_image_tokens = False

    # --- images ---

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """[n_images, 3, H, W] -> [n_images, tokens_per_image, text_dim]."""
        return self.projector(self.encoder(images))

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        encoder_input: Mapping[str, Any] | None = None,
        encoder_mask: Any = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Computes logits (or what ``decoder``'s output settings ask for) of a batch with images.

        Args:
            tokens (torch.Tensor): [b, s] int64 token ids, with ``tokens_per_image`` image tokens per image.
            mask (torch.Tensor | None): [b, s, s_kv] bool, True where a query may attend a key (padding, packed
                documents, or the KV cache's columns during generation); None for causal attention. The tokens of
                each image may attend each other in addition.
            encoder_input (Mapping[str, Any] | None): ``{"images": Tensor[n_images, 3, H, W]}``, the batch's images
                in the order their image tokens appear (row after row; ``n_images`` may be 0); None for text only.
            encoder_mask (Any): accepted for the shared interface and ignored (Gemma 3 finds its images by their
                tokens).
            input_pos (torch.Tensor | None): [b, s] int64 positions; None for ``0..s-1`` (after the cached tokens).

        Returns:
            torch.Tensor | list[torch.Tensor]: [b, s, vocab_size] float32 logits, as ``TransformerDecoder``.

        Raises:
            ValueError: for an ``encoder_input`` without ``"images"``, or, where checked (see the class), image
                tokens that do not match the images in number.
        """
        images = _images(encoder_input)
        is_image = tokens == self.image_token_id  # [b, s]
        # an image token outside the vocabulary is embedded as token 0, then replaced
        embed_ids = (
            tokens.masked_fill(is_image, 0)
            if self.image_token_id >= self.decoder.tok_embeddings.num_embeddings
            else tokens
        )
        h = self.decoder.embed(embed_ids)  # scaled by sqrt(embed_dim) before the images go in, as transformers does
        if images is None:
            # a generated token may be the image token: after the prompt it is embedded as a token, as transformers does
            if self._cache_offset() == 0 and self._checks(tokens) and bool(is_image.any()):
                raise ValueError(
                    f"The tokens hold {int(is_image.sum())} image tokens (id {self.image_token_id}) but no images "
                    'were given; pass encoder_input={"images": ...}.'
                )
            return self.decoder(input_embeds=h, mask=mask, input_pos=input_pos)
        features = self.image_features(images).to(h.dtype)  # [n, tokens_per_image, d]
        num_vectors = features.shape[0] * features.shape[1]
        if self._checks(tokens):
            num_tokens = int(is_image.sum())
            if num_tokens != num_vectors:
                raise ValueError(
                    f"The tokens hold {num_tokens} image tokens, but the {features.shape[0]} image(s) give "
                    f"{num_vectors} vectors ({features.shape[1]} per image)."
                )
        # the k-th image token (row-major) takes the k-th image vector: a gather by running count, no host sync
        flat = features.reshape(num_vectors, -1)
        index = (is_image.flatten().cumsum(0) - 1).clamp(0, num_vectors - 1)
        picked = flat.index_select(0, index).view_as(h)
        h = torch.where(is_image[..., None], picked, h)
        mask = image_attention_mask(is_image, mask, offset=self._cache_offset())
        return self.decoder(input_embeds=h, mask=mask, input_pos=input_pos)

    def _checks(self, tokens: torch.Tensor) -> bool:
        return self.check_image_tokens or tokens.device.type == "cpu"

    def _cache_offset(self) -> int:
        # tokens already in the KV cache: this call's tokens sit after them in the cache's columns
        if not self.decoder.caches_are_enabled():
            return 0
        return self.decoder.layers[0].attn.kv_cache.size


def _images(encoder_input: Mapping[str, Any] | None) -> torch.Tensor | None:
    """The images of ``encoder_input``, or None for none at all."""
    if encoder_input is None:
        return None
    if not isinstance(encoder_input, Mapping) or IMAGES_KEY not in encoder_input:
        raise ValueError(
            f'Gemma 3 takes encoder_input={{"images": Tensor[n_images, 3, H, W]}}, got {type(encoder_input).__name__}'
            f"{' with keys ' + str(sorted(encoder_input)) if isinstance(encoder_input, Mapping) else ''}; build "
            "batches with gemma3_vision_transform and tune.data.padded_collate_images."
        )
    images = encoder_input[IMAGES_KEY]
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"encoder_input['images'] must be a tensor [n_images, 3, H, W], got {shape}.")
    return images if images.shape[0] else None


def image_attention_mask(is_image: torch.Tensor, mask: torch.Tensor | None = None, *, offset: int = 0) -> torch.Tensor:
    """Gemma 3's attention mask for a batch with images: ``mask`` (default causal), plus every pair of tokens of the
    same image.

    An image is a run of consecutive image tokens. Sliding-window layers still apply their window on top (a key
    more than the window behind the query is masked), as transformers does.

    Args:
        is_image (torch.Tensor): [b, s] bool, True at image tokens.
        mask (torch.Tensor | None): [b, s, s_kv] bool, True where a query may attend a key; None for causal.
        offset (int): keys before this call's tokens (the tokens already in a KV cache): the queries are keys
            ``offset .. offset + s - 1``. Default 0.

    Returns:
        torch.Tensor: [b, s, s_kv] bool (``s_kv = offset + s`` when ``mask`` is None).
    """
    batch_size, seq_len = is_image.shape
    if mask is None:
        rows = torch.arange(offset, offset + seq_len, device=is_image.device)[:, None]
        mask = (torch.arange(offset + seq_len, device=is_image.device)[None, :] <= rows)[None]
    starts = is_image & ~F.pad(is_image, (1, 0), value=False)[:, :-1]
    image_ids = torch.where(is_image, starts.long().cumsum(dim=1), 0)  # 1, 2, ... per image; 0 for text
    same_image = (image_ids[:, :, None] == image_ids[:, None, :]) & is_image[:, :, None]  # [b, s, s]
    width = mask.shape[-1]
    if offset or width != seq_len:
        same_image = F.pad(same_image, (offset, width - offset - seq_len), value=False)
    return mask | same_image
