"""Joining a pretrained encoder (e.g. a vision transformer) to a pretrained decoder: deep fusion through
cross-attention layers (Llama 3.2 Vision), and the fusion parameters that join them."""

from tune.modules.model_fusion._deep_fusion import DeepFusionModel
from tune.modules.model_fusion._fusion_layers import FusionEmbedding, FusionLayer
from tune.modules.model_fusion._fusion_utils import get_fusion_params, register_fusion_module

__all__ = ["DeepFusionModel", "FusionEmbedding", "FusionLayer", "get_fusion_params", "register_fusion_module"]
