"""A model converter: keep every embedding row within a maximum L2 norm (a max-norm constraint).

Used from a config as ``model_converters: [{_component_: tune_example_max_norm, max_norm: 1.0}]``.
"""

import torch
from torch import nn


class EmbeddingMaxNormConverter:
    """Renormalises the rows of every ``nn.Embedding`` to at most ``max_norm`` after each optimizer step.

    ``convert`` finds the embeddings and applies the constraint once (so training starts inside it);
    ``post_optimizer_hook`` applies it again after every step.

    Args:
        max_norm (float): the largest L2 norm a row may have. Default 1.0.

    Raises:
        ValueError: when ``max_norm`` is not positive.
    """

    # Declared for tune's order check: rescaling embedding rows composes with any other converter.
    kind = "embedding_max_norm"
    must_precede: tuple[str, ...] = ()
    must_follow: tuple[str, ...] = ()
    conflicts_with: tuple[str, ...] = ()

    def __init__(self, max_norm: float = 1.0) -> None:
        if max_norm <= 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        self.max_norm = max_norm

    def convert(self, model: nn.Module) -> nn.Module:
        """Checks that ``model`` has embeddings and renormalises them; returns ``model``.

        Raises:
            ValueError: when the model has no ``nn.Embedding``.
        """
        if not any(isinstance(m, nn.Embedding) for m in model.modules()):
            raise ValueError(
                "EmbeddingMaxNormConverter found no nn.Embedding in the model; remove it from model_converters"
            )
        self.post_optimizer_hook(model)
        return model

    @torch.no_grad()
    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Scales down the embedding rows whose norm exceeds ``max_norm``."""
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                norms = module.weight.norm(dim=-1, keepdim=True)
                module.weight.mul_(torch.clamp(self.max_norm / norms.clamp_min(1e-12), max=1.0))
