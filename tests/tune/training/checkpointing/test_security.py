import os
import pickle

import pytest
import torch

from tests.tune.training.checkpointing.tiny_llama import FAMILY
from tune.training.checkpointing import FullModelHFCheckpointer, load_recipe_state, safe_torch_load


class _RunsCode:
    # Unpickling this calls os.system: what a malicious checkpoint does.
    def __reduce__(self):
        return (os.system, ("touch /tmp/tune_pwned_by_pickle",))


def test_pickle_carrying_code_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"weight": torch.zeros(2), "payload": _RunsCode()}, path)
    with pytest.raises(ValueError, match=f"Refused to load {path}.*never unpickles"):
        safe_torch_load(path)
    assert not os.path.exists("/tmp/tune_pwned_by_pickle")
    with open(tmp_path / "recipe_state.pt", "wb") as handle:
        pickle.dump(_RunsCode(), handle)
    with pytest.raises(ValueError, match="recipe_state.pt"):
        load_recipe_state(tmp_path / "recipe_state.pt")
    assert not os.path.exists("/tmp/tune_pwned_by_pickle")


def test_checkpointer_refuses_a_malicious_bin(hf_dir, tmp_path):
    for shard in hf_dir.glob("*.safetensors"):
        shard.unlink()
    (hf_dir / "model.safetensors.index.json").unlink()
    torch.save({"model.embed_tokens.weight": _RunsCode()}, hf_dir / "pytorch_model.bin")
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        ckpt.load_checkpoint()
    assert not os.path.exists("/tmp/tune_pwned_by_pickle")


def test_truncated_torch_file_is_named(tmp_path):
    path = tmp_path / "consolidated.00.pth"
    torch.save({"w": torch.randn(100)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="consolidated.00.pth.*corrupt or truncated"):
        safe_torch_load(path)


def test_legacy_format_file_is_read_without_mmap(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.arange(4.0)}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(safe_torch_load(path)["w"], torch.arange(4.0))
