import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from tune.training.checkpointing import DistributedCheckpointer, gather_full_state_dict


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/tune_pwned_by_dcp",))


@pytest.fixture
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trained(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def test_dcp_save_and_resume_restores_sharded_model_and_optimizer(gloo_group, tmp_path):
    model, optimizer = _trained(0)
    ckpt = DistributedCheckpointer(output_dir=tmp_path / "out")
    state = {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
        "steps_run": 5,
    }
    out = ckpt.save_checkpoint(state, step=5, config={"lr": 0.1})
    assert (out / ".complete").is_file() and (out / "config.yaml").is_file()

    other, other_optimizer = _trained(1)
    resumed = DistributedCheckpointer(output_dir=tmp_path / "out", resume_from_checkpoint=True)
    assert resumed.resume_dir == out
    target = {
        "model": get_model_state_dict(other),
        "optimizer": get_optimizer_state_dict(other, other_optimizer),
        "steps_run": 0,
    }
    resumed.load_checkpoint(target)
    set_model_state_dict(other, target["model"])
    set_optimizer_state_dict(other, other_optimizer, target["optimizer"])
    assert target["steps_run"] == 5
    full, other_full = gather_full_state_dict(model), gather_full_state_dict(other)
    assert full.keys() == other_full.keys() and all(torch.equal(full[k], other_full[k]) for k in full)
    assert all(not hasattr(v, "device_mesh") for v in full.values())  # plain tensors, ready for HF output
    for (_, a), (_, b) in zip(optimizer.state.items(), other_optimizer.state.items()):
        assert torch.equal(a["exp_avg"].full_tensor(), b["exp_avg"].full_tensor())


def test_hf_checkpointer_refuses_sharded_tensors(gloo_group, hf_dir, tmp_path):
    from tests.tune.training.checkpointing.tiny_llama import FAMILY
    from tune.training.checkpointing import FullModelHFCheckpointer

    model, _ = _trained(0)
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    with pytest.raises(TypeError, match="gather_full_state_dict"):
        ckpt.save_checkpoint({"model": get_model_state_dict(model)}, step=1)
    assert not (tmp_path / "out" / "step_1").exists()


def test_dcp_load_refuses_pickled_code(gloo_group, tmp_path):
    ckpt = DistributedCheckpointer(output_dir=tmp_path / "out")
    ckpt.save_checkpoint({"weight": torch.ones(2), "payload": _RunsCode()}, step=1)
    resumed = DistributedCheckpointer(output_dir=tmp_path / "out", resume_from_checkpoint=True)
    with pytest.raises(ValueError, match=f"{tmp_path / 'out' / 'step_1'}.*'payload'.*never unpickles"):
        resumed.load_checkpoint({"weight": torch.zeros(2), "payload": None})
    assert not os.path.exists("/tmp/tune_pwned_by_dcp")
