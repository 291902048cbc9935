"""Vision encoders for vision-language models: SigLIP's vision transformer (Zhai et al., 2023)."""

from tune.modules.vision._siglip import SiglipVisionEncoder, VisionMLP, siglip_vision_encoder

__all__ = ["SiglipVisionEncoder", "VisionMLP", "siglip_vision_encoder"]
