"""The checkpointers with the real model families (tune.models), against transformers and peft."""

import json

import torch

from tests.tune.training.checkpointing.tiny_llama import reference_model
from tune.training.checkpointing import ADAPTER_CONFIG, MODEL_KEY, FullModelHFCheckpointer

TOKENS = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))


def _perturb(model, only_adapters=False):
    torch.manual_seed(4)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not only_adapters or "lora_" in name:
                param.add_(0.05 * torch.randn_like(param))


def test_llama_family_output_loads_in_transformers_with_equal_logits(hf_dir, tmp_path):
    from tune.models import from_hf

    ckpt = FullModelHFCheckpointer(hf_dir, model_type="llama3_2", output_dir=tmp_path / "out")
    model = from_hf(hf_dir, dtype=torch.float32)
    model.load_state_dict(ckpt.load_checkpoint()[MODEL_KEY])
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference_model(hf_dir)(TOKENS).logits, rtol=1e-5, atol=1e-5)
    _perturb(model)
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict()}, step=2)
    with torch.no_grad():
        torch.testing.assert_close(reference_model(out)(TOKENS).logits, model(TOKENS), rtol=1e-5, atol=1e-5)


def test_llama_family_lora_adapter_loads_in_peft_with_equal_logits(hf_dir, tmp_path):
    import peft

    from tune.models import from_hf

    lora = {
        "lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True,
        "lora_rank": 4,
        "lora_alpha": 16.0,
    }
    ckpt = FullModelHFCheckpointer(hf_dir, model_type="llama3_2", output_dir=tmp_path / "out")
    model = from_hf(hf_dir, dtype=torch.float32, **lora).eval()
    _perturb(model, only_adapters=True)
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": 4, "lora_alpha": 16.0}}, 1)
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj", "gate_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    with torch.no_grad():
        ours = model(TOKENS)
        peft_model = peft.PeftModel.from_pretrained(reference_model(hf_dir), out / "adapter").eval()
        torch.testing.assert_close(peft_model(TOKENS).logits, ours, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(reference_model(out)(TOKENS).logits, ours, rtol=1e-5, atol=1e-5)
