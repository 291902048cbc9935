"""Model converters of a user's own, named by `_component_` in tests/recipes/test_extension_points.py."""

import torch
from torch import nn

from tune.modules.peft import apply_lora


class LoRAConverter:
    """Puts LoRA adapters on the named linear layers (``tune.modules.peft.apply_lora``): a ``"peft"`` converter.

    Args:
        target_modules (list[str]): layer-name patterns, e.g. ``["q_proj", "v_proj"]``.
        rank (int): LoRA rank.
        alpha (float): LoRA alpha.
    """

    kind = "peft"

    def __init__(self, target_modules: list[str], rank: int = 8, alpha: float = 16.0) -> None:
        self.target_modules, self.rank, self.alpha = list(target_modules), rank, alpha

    def convert(self, model: nn.Module) -> nn.Module:
        return apply_lora(model, self.target_modules, self.rank, self.alpha)

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Nothing to do after a step."""


class EmbeddingNormCapConverter:
    """Keeps every row of ``model.tok_embeddings.weight`` at a norm of at most ``max_norm``.

    ``convert`` rescales the longer rows once; ``post_optimizer_hook`` does it again after every optimizer step,
    so the constraint holds throughout training (a max-norm constraint, as in ``nn.Embedding(max_norm=...)``
    but applied to the weights rather than at lookup).

    Args:
        max_norm (float): the largest row norm allowed.
    """

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    @torch.no_grad()
    def _cap(self, model: nn.Module) -> None:
        weight = model.tok_embeddings.weight  # [vocab, dim]
        norms = weight.norm(dim=-1, keepdim=True)
        weight.mul_(torch.clamp(self.max_norm / norms, max=1.0))

    def convert(self, model: nn.Module) -> nn.Module:
        self._cap(model)
        return model

    def post_optimizer_hook(self, model: nn.Module) -> None:
        self._cap(model)
