"""Gemma 3's image path: a SigLIP vision encoder, the multimodal projector, and the language model they feed.

Each image (896 x 896 in the releases) is encoded into 64 x 64 patch vectors by SigLIP, average-pooled down to
``mm_tokens_per_image`` (256) vectors, RMS-normalised in Gemma's ``1 + weight`` form and projected by a matrix into
the language model's width. The prompt holds that many image tokens per image (``image_token_index``, between the
begin- and end-of-image tokens the processor adds); their embeddings, after Gemma's ``sqrt(embed_dim)`` scaling of
the token embeddings, are replaced by the projected image vectors, image after image, so the image vectors
themselves are not scaled. Attention is causal, except that the tokens of one image attend to each other in both
directions; on the sliding-window layers the window still bounds how far back a query looks.

Weights convert to and from ``Gemma3ForConditionalGeneration``'s: ``vision_tower.vision_model.*``,
``multi_modal_projector.*`` and the language model (either prefix, see ``_convert_weights``) in, the files' layout
out.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.models.gemma3._component_builders import gemma3
from tune.models.gemma3._convert_weights import MULTIMODAL_MODEL_TYPE, gemma3_from_hf_config, gemma3_hf_to_tune
from tune.models.gemma3._convert_weights import gemma3_tune_to_hf as _text_tune_to_hf
from tune.modules import RMSNorm, TransformerDecoder
from tune.modules.vision import SiglipVisionEncoder, siglip_vision_encoder
from tune.utils._state_dict_keys import invert_rules, rename_keys

# Gemma3Config's defaults (transformers) for the image path: token ids, and the SigLIP of the 4B, 12B and 27B sizes
IMAGE_TOKEN_ID = 262_144
VISION_CONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 896,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}


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


class Gemma3VisionLanguageModel(nn.Module):
    """Gemma 3 with images: a vision encoder and projector whose outputs replace the image tokens' embeddings.

    The output settings of the language model (``skip_output_layer``, ``set_num_output_chunks``) apply as they
    are set on ``decoder``. Generation with a KV cache is not supported yet (the image-block mask is built for a
    whole sequence).

    Args:
        vision_encoder (SiglipVisionEncoder): images -> patch vectors.
        projector (Gemma3MultiModalProjector): patch vectors -> image-token embeddings.
        decoder (TransformerDecoder): the Gemma 3 language model.
        image_token_id (int): the placeholder token each image vector replaces (``image_token_index``).
    """

    def __init__(
        self,
        *,
        vision_encoder: SiglipVisionEncoder,
        projector: Gemma3MultiModalProjector,
        decoder: TransformerDecoder,
        image_token_id: int,
    ) -> None:
        super().__init__()
        self.vision_encoder = vision_encoder
        self.projector = projector
        self.decoder = decoder
        self.image_token_id = image_token_id

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[n_images, 3, H, W] -> [n_images, tokens_per_image, text_dim]."""
        return self.projector(self.vision_encoder(pixel_values))

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        pixel_values: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Computes logits (or what ``decoder``'s output settings ask for) of a batch with images.

        Args:
            tokens (torch.Tensor): [b, s] int64 token ids, with ``tokens_per_image`` image tokens per image.
            pixel_values (torch.Tensor | None): [n_images, 3, H, W], the batch's images in the order their image
                tokens appear (row after row); None for text only.
            mask (torch.Tensor | None): [b, s, s] bool, True where a query may attend a key (padding, packed
                documents); None for causal attention. The tokens of each image may attend each other in
                addition.
            input_pos (torch.Tensor | None): [b, s] int64 positions; None for ``0..s-1``.

        Returns:
            torch.Tensor | list[torch.Tensor]: [b, s, vocab_size] float32 logits, as ``TransformerDecoder``.

        Raises:
            ValueError: if the image tokens and the images do not match in number.
        """
        is_image = tokens == self.image_token_id
        # an image token outside the vocabulary (the releases' 262144) is embedded as token 0, then replaced
        embed_ids = (
            tokens.masked_fill(is_image, 0)
            if self.image_token_id >= self.decoder.tok_embeddings.num_embeddings
            else tokens
        )
        h = self.decoder.embed(embed_ids)  # scaled by sqrt(embed_dim) before the images go in, as transformers does
        num_image_tokens = int(is_image.sum())
        if pixel_values is not None:
            features = self.image_features(pixel_values).to(h.dtype)
            if num_image_tokens != features.shape[0] * features.shape[1]:
                raise ValueError(
                    f"The tokens hold {num_image_tokens} image tokens, but the {features.shape[0]} image(s) give "
                    f"{features.shape[0] * features.shape[1]} vectors ({features.shape[1]} per image)."
                )
            h = h.masked_scatter(is_image[..., None], features)
        elif num_image_tokens:
            raise ValueError(f"The tokens hold {num_image_tokens} image tokens but no pixel_values were given.")
        if num_image_tokens:
            mask = image_attention_mask(is_image, mask)
        return self.decoder(input_embeds=h, mask=mask, input_pos=input_pos)


def image_attention_mask(is_image: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Gemma 3's attention mask for a batch with images: ``mask`` (default causal), plus every pair of tokens of the
    same image.

    An image is a run of consecutive image tokens. Sliding-window layers still apply their window on top (a key
    more than the window behind the query is masked), as transformers does.

    Args:
        is_image (torch.Tensor): [b, s] bool, True at image tokens.
        mask (torch.Tensor | None): [b, s, s] bool, True where a query may attend a key; None for causal.

    Returns:
        torch.Tensor: [b, s, s] bool.
    """
    batch_size, seq_len = is_image.shape
    if mask is None:
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=is_image.device).tril()[None]
    starts = is_image & ~F.pad(is_image, (1, 0), value=False)[:, :-1]
    image_ids = torch.where(is_image, starts.long().cumsum(dim=1), 0)  # 1, 2, ... per image; 0 for text
    same_image = (image_ids[:, :, None] == image_ids[:, None, :]) & is_image[:, :, None]
    return mask | same_image


def gemma3_vision_language_model(
    *,
    image_size: int,
    patch_size: int,
    vision_embed_dim: int,
    vision_num_layers: int,
    vision_num_heads: int,
    vision_intermediate_dim: int,
    mm_tokens_per_image: int,
    image_token_id: int = IMAGE_TOKEN_ID,
    vision_norm_eps: float = 1e-6,
    **text_dims: Any,
) -> Gemma3VisionLanguageModel:
    """A Gemma 3 vision-language model of the given sizes, randomly initialised.

    Args:
        image_size (int): side of the input images in pixels (896 in the releases).
        patch_size (int): side of a SigLIP patch (14).
        vision_embed_dim (int): SigLIP width (1152).
        vision_num_layers (int): SigLIP layers (27).
        vision_num_heads (int): SigLIP attention heads (16).
        vision_intermediate_dim (int): SigLIP MLP width (4304).
        mm_tokens_per_image (int): image tokens per image (256): a square whose side divides
            ``image_size // patch_size``.
        image_token_id (int): the image placeholder token. Default 262144 (Gemma 3's).
        vision_norm_eps (float): epsilon of SigLIP's LayerNorms and of the projector's RMSNorm. Default 1e-6.
        **text_dims: the language model's arguments, as in :func:`tune.models.gemma3.gemma3`.

    Returns:
        Gemma3VisionLanguageModel: the model.

    Raises:
        ValueError: for inconsistent sizes.
    """
    encoder = siglip_vision_encoder(
        image_size=image_size,
        patch_size=patch_size,
        embed_dim=vision_embed_dim,
        num_layers=vision_num_layers,
        num_heads=vision_num_heads,
        intermediate_dim=vision_intermediate_dim,
        norm_eps=vision_norm_eps,
    )
    decoder = gemma3(**text_dims)
    return _assemble(encoder, decoder, mm_tokens_per_image, image_token_id, vision_norm_eps)


def _assemble(
    encoder: SiglipVisionEncoder, decoder: TransformerDecoder, tokens_per_image: int, image_token_id: int, eps: float
) -> Gemma3VisionLanguageModel:
    projector = Gemma3MultiModalProjector(
        vision_dim=encoder.embed_dim,
        text_dim=decoder.tok_embeddings.embedding_dim,
        patches_per_side=encoder.patches_per_side,
        tokens_per_image=tokens_per_image,
        norm_eps=eps,
    )
    return Gemma3VisionLanguageModel(
        vision_encoder=encoder, projector=projector, decoder=decoder, image_token_id=image_token_id
    )


def _vision_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    return {**VISION_CONFIG_DEFAULTS, **(hf_config.get("vision_config") or {})}


def gemma3_vision_language_from_hf_config(hf_config: Mapping[str, Any]) -> Gemma3VisionLanguageModel:
    """Builds a Gemma 3 vision-language model with the dimensions of a ``Gemma3ForConditionalGeneration``
    ``config.json`` (``model_type: gemma3``).

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict.

    Returns:
        Gemma3VisionLanguageModel: the model, randomly initialised.

    Raises:
        ValueError: for a config of another model type, or a vision tower unlike Gemma 3's (a pooling head, an
            activation other than tanh-GELU); and as ``gemma3_from_hf_config`` for the language model.
    """
    if hf_config.get("model_type") != MULTIMODAL_MODEL_TYPE:
        raise ValueError(
            f"A Gemma 3 vision-language model needs a config.json with model_type {MULTIMODAL_MODEL_TYPE!r}, got "
            f"{hf_config.get('model_type')!r}."
        )
    vision = _vision_config(hf_config)
    if vision["vision_use_head"]:
        raise ValueError("config.json's vision_config sets vision_use_head=true; Gemma 3's SigLIP has no head.")
    if vision["hidden_act"] != "gelu_pytorch_tanh":
        raise ValueError(f"SigLIP activation {vision['hidden_act']!r} is not supported; only 'gelu_pytorch_tanh'.")
    encoder = siglip_vision_encoder(
        image_size=vision["image_size"],
        patch_size=vision["patch_size"],
        embed_dim=vision["hidden_size"],
        num_layers=vision["num_hidden_layers"],
        num_heads=vision["num_attention_heads"],
        intermediate_dim=vision["intermediate_size"],
        norm_eps=vision["layer_norm_eps"],
        attn_dropout=vision["attention_dropout"] or 0.0,
        in_channels=vision["num_channels"],
    )
    decoder = gemma3_from_hf_config(hf_config)
    image_token_id = hf_config.get("image_token_id", hf_config.get("image_token_index", IMAGE_TOKEN_ID))
    tokens_per_image = hf_config.get("mm_tokens_per_image", 256)
    return _assemble(encoder, decoder, tokens_per_image, image_token_id, vision["layer_norm_eps"])


# The vision tower and projector in the files' layout (a module tree's keys are put in it first), HF -> tune.
_VISION_LAYER = r"vision_tower\.vision_model\.encoder\.layers\.(\d+)\."
GEMMA3_VISION_RULES = (
    (r"vision_tower\.vision_model\.embeddings\.patch_embedding\.", "vision_encoder.patch_embedding."),
    (r"vision_tower\.vision_model\.embeddings\.position_embedding\.", "vision_encoder.position_embedding."),
    (_VISION_LAYER + r"self_attn\.q_proj\.", r"vision_encoder.layers.\1.attn.q_proj."),
    (_VISION_LAYER + r"self_attn\.k_proj\.", r"vision_encoder.layers.\1.attn.k_proj."),
    (_VISION_LAYER + r"self_attn\.v_proj\.", r"vision_encoder.layers.\1.attn.v_proj."),
    (_VISION_LAYER + r"self_attn\.out_proj\.", r"vision_encoder.layers.\1.attn.output_proj."),
    (_VISION_LAYER + r"layer_norm1\.", r"vision_encoder.layers.\1.sa_norm."),
    (_VISION_LAYER + r"layer_norm2\.", r"vision_encoder.layers.\1.mlp_norm."),
    (_VISION_LAYER + r"mlp\.", r"vision_encoder.layers.\1.mlp."),
    (r"vision_tower\.vision_model\.post_layernorm\.", "vision_encoder.norm."),
    (r"multi_modal_projector\.mm_soft_emb_norm\.", "projector.norm."),
    (r"multi_modal_projector\.mm_input_projection_weight", "projector.projection"),
)
# SigLIP's prefix in the files, and in transformers 5's module tree (which drops "vision_model.")
_FILE_TOWER, _TREE_TOWER = "vision_tower.vision_model.", "vision_tower."
_IMAGE_PATH = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")
_TUNE_IMAGE_PATH = re.compile(r"^(vision_encoder|projector)\.")
_DECODER = "decoder."


def gemma3_vision_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``Gemma3ForConditionalGeneration`` state dict (the files' keys or transformers 5's module tree's) -> the keys of
    :class:`Gemma3VisionLanguageModel`.

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    image, text = {}, {}
    for key, value in state_dict.items():
        if _IMAGE_PATH.match(key):
            key = key.removeprefix("model.")
            if key.startswith(_TREE_TOWER) and not key.startswith(_FILE_TOWER):  # transformers 5's module tree
                key = _FILE_TOWER + key.removeprefix(_TREE_TOWER)
            image[key] = value
        else:
            text[key] = value
    converted = rename_keys(image, GEMMA3_VISION_RULES)
    for key, value in gemma3_hf_to_tune(text, hf_config).items():
        converted[_DECODER + key] = value
    return converted


def gemma3_vision_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`Gemma3VisionLanguageModel` state dict -> ``Gemma3ForConditionalGeneration`` keys as in its files
    (``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``; no ``lm_head``,
    which is tied).

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    image, text = {}, {}
    for key, value in state_dict.items():
        if _TUNE_IMAGE_PATH.match(key):
            image[key] = value
        elif key.startswith(_DECODER):
            text[key.removeprefix(_DECODER)] = value
        else:
            raise ValueError(f"State-dict key {key!r} belongs to no part of a Gemma 3 vision-language model.")
    converted = rename_keys(image, invert_rules(GEMMA3_VISION_RULES), source="tune")
    converted.update(_text_tune_to_hf(text, {**hf_config, "model_type": MULTIMODAL_MODEL_TYPE}))
    return converted
