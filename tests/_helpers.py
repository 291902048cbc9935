"""Helpers shared by tests in different folders (tests/tune and tests/recipes)."""

import socket

import torch


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: the rendezvous port of a test's own ``mp.spawn`` ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The built-in model families (tune/models/<family>), sorted: what the registry must find without a plugin.
BUILT_IN_FAMILIES = [
    "code_llama2",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_vision",
    "llama2",
    "llama3",
    "llama3_1",
    "llama3_2",
    "llama3_2_vision",
    "llama3_3",
    "llama4",
    "mistral",
    "phi3",
    "phi4",
    "qwen2",
    "qwen2_5",
    "qwen2_5_vl",
    "qwen3",
    "qwen3_moe",
]


class ListDataset(torch.utils.data.Dataset):
    """A map-style dataset over a list of samples."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def three_documents() -> list[dict]:
    """Three tokenized samples of lengths 3, 4 and 2 with some labels ignored: the packing and collate inputs."""
    return [
        {"tokens": [1, 10, 11], "labels": [-100, 10, 11]},
        {"tokens": [1, 20, 21, 22], "labels": [1, 20, -100, 22]},
        {"tokens": [1, 30], "labels": [1, 30]},
    ]


def assert_close_after_adamw(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, lr: float, steps: int
) -> None:
    """Weights of two runs that compute the same steps in a different order (ranks, batching, a plain loop).

    AdamW moves each weight by up to ``lr`` a step, by ``m / sqrt(v)``: two runs whose sums round differently agree
    to a small part of a step (here: lr / 100) where the gradient is well above rounding, while an element whose
    gradient is rounding noise may be moved either way. So every element must be within what opposite updates do
    in ``steps`` steps, and all but 1 in 1,000 within lr / 100 (measured: 2 of 30k at lr 1e-2, 1 of 380k at 1e-3).
    """
    assert actual.keys() == expected.keys()
    total = outliers = 0
    for key, value in expected.items():
        diff = (actual[key].float() - value.float()).abs()
        assert diff.max() <= 2 * lr * steps, f"{key}: {diff.max():.3g} apart, more than 2 * lr * steps"
        outliers += int((diff > lr / 100).sum())
        total += diff.numel()
    assert outliers <= 1e-3 * total, f"{outliers} of {total} elements differ by more than lr / 100"
