"""Vision encoders for vision-language models: SigLIP's vision transformer (Zhai et al., 2023) and
Qwen2.5-VL's windowed one."""

from tune.modules.vision._qwen_vision import QwenPatchMerger, QwenVisionTransformer, VisionRotaryEmbeddings2D
from tune.modules.vision._siglip import SiglipVisionEncoder, VisionMLP, siglip_vision_encoder

__all__ = [
    "QwenPatchMerger",
    "QwenVisionTransformer",
    "SiglipVisionEncoder",
    "VisionMLP",
    "VisionRotaryEmbeddings2D",
    "siglip_vision_encoder",
]
