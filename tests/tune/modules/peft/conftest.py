"""Shared pieces of the PEFT tests: a small attention-like block and its Hugging Face PEFT twin."""

import copy

import pytest
import torch
from torch import nn

RANK, ALPHA = 4, 8.0
DIM = 32


class TinyBlock(nn.Module):
    """A gated block with the projection names LoRA usually targets (q_proj with a bias, v_proj without)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(DIM, 64, bias=True)
        self.v_proj = nn.Linear(DIM, 64, bias=False)
        self.output_proj = nn.Linear(64, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_proj(nn.functional.silu(self.q_proj(x)) * self.v_proj(x))


@pytest.fixture
def tiny_block() -> TinyBlock:
    torch.manual_seed(0)
    return TinyBlock()


def _make_peft_pair(base: nn.Module, *, use_dora: bool, dropout: float = 0.0):
    """Returns (peft_model, our_model) with identical, non-trivial adapters on q_proj and v_proj.

    PEFT initialises its adapters (A Kaiming, B zeros, DoRA magnitude = ||W||_c); B and the magnitude are then
    set to random values so the adapters change the output, and the same tensors are copied into ours.
    """
    from peft import LoraConfig, get_peft_model

    from tune.modules.peft import apply_lora

    config = LoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=dropout, target_modules=["q_proj", "v_proj"], use_dora=use_dora
    )
    peft_model = get_peft_model(copy.deepcopy(base), config)
    targets = ["q_proj", "v_proj"]
    ours = apply_lora(copy.deepcopy(base), targets, rank=RANK, alpha=ALPHA, dropout=dropout, use_dora=use_dora)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in ("q_proj", "v_proj"):
            theirs, mine = getattr(peft_model.base_model.model, name), getattr(ours, name)
            lora_b = theirs.lora_B["default"].weight
            lora_b.copy_(torch.randn(lora_b.shape, generator=generator))
            mine.lora_a.weight.copy_(theirs.lora_A["default"].weight)
            mine.lora_b.weight.copy_(theirs.lora_B["default"].weight)
            if use_dora:
                magnitude = theirs.lora_magnitude_vector["default"].weight
                magnitude.mul_(1.0 + 0.5 * torch.rand(magnitude.shape, generator=generator))
                mine.magnitude.copy_(magnitude)
    return peft_model, ours


@pytest.fixture
def make_peft_pair():
    """The factory above, as a fixture (test modules cannot import conftest reliably)."""
    return _make_peft_pair
