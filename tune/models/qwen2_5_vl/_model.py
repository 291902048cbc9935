"""Qwen2.5-VL: the vision transformer's merged patch vectors take the place of the image tokens' embeddings in a
Qwen2.5 language model whose RoPE has three position axes (M-RoPE).

The prompt holds one ``<|image_pad|>`` token per merge block of each image (``t * h * w / merge_size ** 2``), the
images of the batch in row order. Their embeddings are replaced by the encoder's vectors, image after image. Text
tokens advance all three positions by one. An image's tokens take the position where it starts plus their frame,
row and column in the merged grid; the text after an image continues from its start plus the larger side of the
grid (transformers' ``get_rope_index``).
"""

import torch
from torch import nn

from tune.modules import DecoderWrapper, TransformerDecoder
from tune.modules.vision import QwenVisionTransformer


class Qwen2_5_VisionLanguageModel(DecoderWrapper, nn.Module):
    """Qwen2.5-VL: a vision encoder (with its patch merger) feeding a Qwen2.5 decoder with M-RoPE.

    The output settings of the language model (``skip_output_layer``, ``set_num_output_chunks``) and its KV caches
    are those of ``decoder``; this module passes them through.

    The image tokens are checked against the images (their number, whole images per row) when ``tokens`` is on the
    CPU, where counting them costs nothing; on an accelerator the count would wait for the device in every step, so
    it is skipped unless ``check_image_tokens`` is set to True. ``image_grid_thw`` is read on the host (the vision
    tower lays out its attention from it): ``tune.training.batch_to_device`` leaves it on the CPU.

    Generation with a KV cache: the first call after ``setup_caches`` or ``reset_caches`` holds the whole prompt and
    its images; the model remembers each row's shift of the text positions by its images (transformers'
    ``rope_deltas``) and adds it to the ``[b, s]`` (or default) positions of the later calls, which take no images.

    Args:
        encoder (QwenVisionTransformer): images -> one vector per merge block, in the language model's width.
        decoder (TransformerDecoder): the language model, whose attention layers use
            :class:`~tune.modules.MultimodalRotaryEmbeddings`.
        image_token_id (int): the placeholder each image vector replaces (``<|image_pad|>``, 151655 in the
            releases).
    """

    def __init__(self, *, encoder: QwenVisionTransformer, decoder: TransformerDecoder, image_token_id: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.image_token_id = image_token_id
        self.check_image_tokens = False
        self._rope_deltas: torch.Tensor | None = None  # [b]: set by a cached prompt with images

    def _forget_decoding_state(self) -> None:
        self._rope_deltas = None

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        encoder_input: dict[str, torch.Tensor] | None = None,
        encoder_mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Computes logits (or what ``decoder``'s output settings ask for) of a batch with images.

        Args:
            tokens (torch.Tensor): [b, s] int64 token ids, with one image token per merge block of each image.
            mask (torch.Tensor | None): [b, s, s] bool, True where a query may attend a key (padding, packed
                documents); None for causal attention.
            encoder_input (dict[str, torch.Tensor] | None): ``pixel_values`` [n_patches, patch_dim] and
                ``image_grid_thw`` [n_images, 3] int64 of the batch's images in row order (the image processor's
                output); None for a text-only batch.
            encoder_mask (torch.Tensor | None): unused (the image tokens are in the decoder's sequence); accepted so
                every vision-language model takes the same arguments.
            input_pos (torch.Tensor | None): [b, s] int64 text positions (per document for packed rows, from the
                padding for left-padded ones), from which the three M-RoPE positions are computed; or the M-RoPE
                positions themselves as [3, b, s]; None for ``0..s-1`` (after the tokens in the KV cache). With a
                KV cache, ``[b, s]`` positions after the prompt are shifted by the prompt's images.

        Returns:
            torch.Tensor | list[torch.Tensor]: [b, s, vocab_size] float32 logits, as ``TransformerDecoder``.

        Raises:
            ValueError: if the image tokens do not match the images, or ``encoder_input`` lacks a key.
        """
        is_image = tokens == self.image_token_id
        h = self.decoder.embed(tokens)
        cached = self._cached_tokens()
        if cached and (input_pos is None or input_pos.dim() == 2):
            input_pos = self._decoding_positions(tokens, cached, input_pos)
        if encoder_input is None:
            if self._checks(tokens) and bool(is_image.any()):
                raise ValueError(
                    f"The tokens hold {int(is_image.sum())} image tokens but no encoder_input (pixel_values and "
                    "image_grid_thw) was given."
                )
            if cached == 0:
                self._rope_deltas = None  # a text-only prompt: nothing to shift
            return self.decoder(input_embeds=h, mask=mask, input_pos=input_pos)
        missing = {"pixel_values", "image_grid_thw"} - set(encoder_input)
        if missing:
            raise ValueError(
                f"encoder_input lacks {sorted(missing)}; Qwen2.5-VL takes the image processor's pixel_values and "
                "image_grid_thw."
            )
        grid_thw = encoder_input["image_grid_thw"]
        features = self.encoder(encoder_input["pixel_values"], grid_thw)  # [n_image_tokens, embed_dim]
        checks = self._checks(tokens)
        if checks and int(is_image.sum()) != features.shape[0]:
            raise ValueError(
                f"The tokens hold {int(is_image.sum())} image tokens, but the images (image_grid_thw "
                f"{grid_thw.tolist()}) give {features.shape[0]} vectors."
            )
        # the k-th image token (row-major) takes the k-th vector: a gather by running count, no host sync
        index = (is_image.flatten().cumsum(0) - 1).clamp(0, max(features.shape[0] - 1, 0))
        picked = features.to(h.dtype).index_select(0, index).view_as(h)
        h = torch.where(is_image[..., None], picked, h)
        if input_pos is None or input_pos.dim() == 2:
            text_pos = input_pos
            input_pos = mrope_positions(is_image, grid_thw, self.encoder.merge_size, text_pos, check=checks)
            if cached == 0:
                # the next token's position is one past the largest of the last one's three, not its text position
                last = tokens.shape[1] - 1 if text_pos is None else text_pos[:, -1]
                self._rope_deltas = input_pos[:, :, -1].max(dim=0).values - last
        return self.decoder(input_embeds=h, mask=mask, input_pos=input_pos)

    def _checks(self, tokens: torch.Tensor) -> bool:
        return self.check_image_tokens or tokens.device.type == "cpu"

    def _cached_tokens(self) -> int | None:
        """Tokens already in the KV caches; None when the caches are not in use."""
        if not self.decoder.caches_are_enabled():
            return None
        return self.decoder.layers[0].attn.kv_cache.size

    def _decoding_positions(self, tokens: torch.Tensor, cached: int, input_pos: torch.Tensor | None) -> torch.Tensor:
        """[b, s] text positions of tokens after a cached prompt, shifted by the prompt's images."""
        if input_pos is None:
            input_pos = torch.arange(cached, cached + tokens.shape[1], device=tokens.device).expand_as(tokens)
        if self._rope_deltas is None:
            return input_pos
        return input_pos + self._rope_deltas[:, None]


def mrope_positions(
    is_image: torch.Tensor,
    image_grid_thw: torch.Tensor,
    merge_size: int = 2,
    input_pos: torch.Tensor | None = None,
    *,
    check: bool = True,
) -> torch.Tensor:
    """The three M-RoPE positions (temporal, height, width) of a batch with images, as transformers'
    ``get_rope_index`` computes them for the real tokens.

    A sequence is a run of tokens whose ``input_pos`` counts up by one; a packed row holds several, a padding token
    of a left-padded row (position 0) is one of its own. In a sequence, text tokens take their ``input_pos`` plus
    the shift of the images before them; each image shifts what follows by ``max(rows, cols) - num_tokens`` (its
    merged grid's larger side, less its tokens); an image's tokens take the position where it starts plus their
    frame, row and column.

    Args:
        is_image (torch.Tensor): [b, s] bool, True at image tokens; the images' tokens row after row.
        image_grid_thw (torch.Tensor): [n_images, 3] int64 patch grids of the images, in that order.
        merge_size (int): side of a merge block in patches. Default 2.
        input_pos (torch.Tensor | None): [b, s] int64 text positions; None for ``0..s-1`` in every row.
        check (bool): check that the image tokens fill the images exactly (reads the tokens on the host: a wait for
            an accelerator). Default True.

    Returns:
        torch.Tensor: [3, b, s] int64.

    Raises:
        ValueError: if the image tokens do not fill the images exactly, or an image runs across rows.
    """
    batch_size, seq_len = is_image.shape
    device = is_image.device
    if input_pos is None:
        input_pos = torch.arange(seq_len, device=device).expand(batch_size, seq_len)
    grid = image_grid_thw.to(device, non_blocking=True)
    frames, rows, cols = grid[:, 0], grid[:, 1] // merge_size, grid[:, 2] // merge_size
    counts = frames * rows * cols  # image tokens per image
    ends = counts.cumsum(0)
    row_ends = is_image.sum(1).cumsum(0)
    if check and (int(row_ends[-1]) != int(ends[-1]) or not bool(torch.isin(row_ends[is_image.any(1)], ends).all())):
        raise ValueError(
            f"The image tokens of each row must make up whole images: rows hold {is_image.sum(1).tolist()} image "
            f"tokens, the images (image_grid_thw {image_grid_thw.tolist()}) take {counts.tolist()}."
        )
    flat = is_image.flatten()
    ordinal = flat.long().cumsum(0) - 1  # index among all image tokens
    image = torch.searchsorted(ends, ordinal.clamp(min=0), right=True).clamp(max=len(counts) - 1)
    offset = torch.where(flat, ordinal - (ends - counts)[image], 0)  # index within its image
    frame = offset // (rows * cols)[image]
    row = offset // cols[image] % rows[image]
    col = offset % cols[image]
    # after its last token, an image moves the positions on by its grid's larger side instead of its token count
    advance = torch.maximum(rows, cols) - counts
    is_last = flat & (offset == counts[image] - 1)
    increment = torch.where(is_last, advance[image], 0).view(batch_size, seq_len)
    before = increment.cumsum(1) - increment  # the shift of the images that ended before each token
    index = torch.arange(seq_len, device=device).expand(batch_size, seq_len)
    starts = torch.ones_like(is_image)
    starts[:, 1:] = input_pos[:, 1:] != input_pos[:, :-1] + 1
    sequence_start = torch.where(starts, index, 0).cummax(dim=1).values
    shift = before - before.gather(1, sequence_start)  # only images of the token's own sequence count
    text = input_pos + shift
    image_start = text - offset.view(batch_size, seq_len)
    grid_pos = torch.stack((frame, row, col)).view(3, batch_size, seq_len)
    return torch.where(is_image, image_start + grid_pos, text)
