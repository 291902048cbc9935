import json

import torch
from safetensors.torch import save_file

from tests.tune.training.checkpointing.tiny_llama import FAMILY, HF_CONFIG, TinyLlama
from tune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    MODEL_KEY,
    FullModelTorchTuneCheckpointer,
    load_adapter_weights,
)


def _native_dir(tmp_path, with_config):
    directory = tmp_path / "native"
    directory.mkdir()
    torch.manual_seed(0)
    save_file(TinyLlama().state_dict(), directory / "model.safetensors")
    if with_config:
        (directory / "config.json").write_text(json.dumps(HF_CONFIG))
    return directory


def test_native_round_trip_and_resume_of_a_lora_run(tmp_path):
    directory = _native_dir(tmp_path, with_config=False)
    ckpt = FullModelTorchTuneCheckpointer(directory, output_dir=tmp_path / "out")
    base = ckpt.load_checkpoint()[MODEL_KEY]
    model = TinyLlama(lora={"rank": 2, "alpha": 4.0})
    model.load_state_dict(base, strict=False)
    with torch.no_grad():
        model.layers[0].attn.q_proj.lora_b.weight.normal_()
    state = {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": 2, "lora_alpha": 4.0}, "steps_run": 3}
    out = ckpt.save_checkpoint(state, step=3, intermediate_checkpoint=True)
    assert (out / "model.safetensors").is_file() and (out / "adapter" / "adapter_model.safetensors").is_file()
    # resume: base weights from checkpoint_dir, adapter (tune keys: no family given) from the checkpoint
    resumed = FullModelTorchTuneCheckpointer(directory, output_dir=tmp_path / "out", resume_from_checkpoint=True)
    loaded = resumed.load_checkpoint()
    assert loaded["steps_run"] == 3
    assert all(torch.equal(loaded[MODEL_KEY][k], v) for k, v in base.items())
    fresh = TinyLlama(lora={"rank": 2, "alpha": 4.0})
    fresh.load_state_dict(loaded[MODEL_KEY], strict=False)
    load_adapter_weights(fresh, loaded[ADAPTER_KEY])
    tokens = torch.arange(10)[None]
    with torch.no_grad():
        assert torch.equal(fresh(tokens), model(tokens))
        # the merged full model in tune keys computes the same
        merged = TinyLlama()
        merged_state = FullModelTorchTuneCheckpointer(out, output_dir=tmp_path / "o2").load_checkpoint()[MODEL_KEY]
        merged.load_state_dict(merged_state)
        torch.testing.assert_close(merged(tokens), model(tokens), rtol=1e-5, atol=1e-5)


def test_native_with_family_writes_peft_adapter(tmp_path):
    directory = _native_dir(tmp_path, with_config=True)
    ckpt = FullModelTorchTuneCheckpointer(directory, model_type=FAMILY, output_dir=tmp_path / "out")
    model = TinyLlama(lora={"rank": 2, "alpha": 4.0})
    model.load_state_dict(ckpt.load_checkpoint()[MODEL_KEY], strict=False)
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": 2, "lora_alpha": 4.0}}, 1)
    from safetensors import safe_open

    with safe_open(str(out / "adapter" / "adapter_model.safetensors"), "pt") as handle:
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in handle.keys()


def test_keep_last_n_config_and_resume_errors(tmp_path):
    import pytest
    import yaml

    directory = _native_dir(tmp_path, with_config=False)
    with pytest.raises(ValueError, match="no complete intermediate checkpoint.*resume_from_checkpoint: false"):
        FullModelTorchTuneCheckpointer(directory, output_dir=tmp_path / "out", resume_from_checkpoint=True)
    ckpt = FullModelTorchTuneCheckpointer(directory, output_dir=tmp_path / "out", keep_last_n_checkpoints=2)
    state = ckpt.load_checkpoint()
    for step in (1, 2, 3):
        ckpt.save_checkpoint(
            {**state, "steps_run": step},
            epoch=0,
            step=step,
            intermediate_checkpoint=True,
            config={"output_dir": str(tmp_path / "out"), "step": step},
        )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["step_2", "step_3"]
    assert yaml.safe_load((tmp_path / "out" / "step_3" / "config.yaml").read_text())["step"] == 3
    resumed = FullModelTorchTuneCheckpointer(directory, output_dir=tmp_path / "out", resume_from_checkpoint=True)
    assert resumed.resume_dir.name == "step_3" and resumed.load_checkpoint()["steps_run"] == 3
    with pytest.raises(TypeError, match="intermediate_checkpoint by keyword"):
        ckpt.save_checkpoint(state, 0, True)
