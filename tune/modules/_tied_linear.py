"""An output projection that reuses the token-embedding matrix (tied embeddings)."""

import torch
import torch.nn.functional as F
from torch import nn


class TiedLinear(nn.Module):
    """Projects hidden states to vocabulary logits with the weight of an embedding module.

    The embedding is referenced, not registered as a child, so its weight appears once in ``parameters()`` and in
    the state dict (under the embedding's key). The weight is read at every call, so a module that replaces the
    embedding's parameter (``to``, FSDP sharding) keeps the tie.

    Args:
        tied_module (nn.Module): a module with a ``weight`` [vocab_size, embed_dim], usually the ``nn.Embedding``.
        softcapping (float | None): caps logits smoothly to ``(-c, c)`` with ``c * tanh(x / c)`` (Gemma 2's final
            logit soft-capping). It lives here, in the output module, so a loss that applies ``model.output``
            itself (chunked cross-entropy) caps too. None for no capping.
    """

    def __init__(self, tied_module: nn.Module, *, softcapping: float | None = None) -> None:
        super().__init__()
        self.__dict__["tied_module"] = tied_module  # bypass nn.Module registration on purpose
        self.softcapping = softcapping

    @property
    def weight(self) -> torch.Tensor:
        """The tied embedding weight [vocab_size, embed_dim]."""
        return self.tied_module.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., embed_dim] -> [..., vocab_size]."""
        logits = F.linear(x, self.weight)
        if self.softcapping is not None:
            logits = torch.tanh(logits / self.softcapping) * self.softcapping
        return logits

    def extra_repr(self) -> str:
        vocab_size, embed_dim = self.weight.shape
        return f"embed_dim={embed_dim}, vocab_size={vocab_size}, softcapping={self.softcapping}"
