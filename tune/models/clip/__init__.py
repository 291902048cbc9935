"""CLIP's vision transformer over tiled images (the encoder Llama 3.2 Vision builds on): its builder, position
embeddings and image transform. Not a model family of its own: families build on it (``tune.registry`` skips this
package, see ``SHARED_COMPONENT_PACKAGES``)."""

from tune.models.clip._component_builders import clip_vision_encoder
from tune.models.clip._position_embeddings import (
    TiledTokenPositionalEmbedding,
    TilePositionalEmbedding,
    TokenPositionalEmbedding,
    default_aspect_ratios,
)
from tune.models.clip._transform import CLIPImageTransform

__all__ = [
    "CLIPImageTransform",
    "TiledTokenPositionalEmbedding",
    "TilePositionalEmbedding",
    "TokenPositionalEmbedding",
    "clip_vision_encoder",
    "default_aspect_ratios",
]
