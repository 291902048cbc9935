"""torchtune's device helpers in tune.utils: device support, batch moves, version checks, world size and rank."""

import pytest
import torch

from tune.utils import (
    DeviceSupport,
    batch_to_device,
    get_device_support,
    get_torch_device_namespace,
    get_world_size_and_rank,
    torch_version_ge,
)


def test_device_support_on_this_machine():
    assert DeviceSupport.from_type("cuda").communication_backend == "nccl"
    assert DeviceSupport.CPU.device_name == "CPU"
    with pytest.raises(ValueError, match="known: cpu, cuda"):
        DeviceSupport.from_type("tpu")
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    expected = "cuda" if torch.cuda.is_available() else "xpu" if xpu else "cpu"
    assert get_device_support().device_type == expected
    assert get_torch_device_namespace() is getattr(torch, expected)


def test_batch_to_device_moves_nested_tensors_in_place():
    batch = {"tokens": torch.ones(2, dtype=torch.long), "extra": {"mask": torch.zeros(2, dtype=torch.bool)}}
    batch_to_device(batch, torch.device("meta"))
    assert batch["tokens"].is_meta and batch["extra"]["mask"].is_meta
    with pytest.raises(ValueError, match=r"batch\['ids'\] is a list"):
        batch_to_device({"ids": [1, 2]}, torch.device("cpu"))


def test_torch_version_ge_compares_release_numbers(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.0.dev20250101+cpu")
    assert torch_version_ge("2.9") and torch_version_ge("2.10")  # a nightly counts as its release
    assert not torch_version_ge("2.11") and not torch_version_ge("3")


def test_get_world_size_and_rank_outside_a_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert get_world_size_and_rank() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert get_world_size_and_rank() == (4, 3)
