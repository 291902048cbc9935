"""LoRA on a model built without it: `tune run lora_finetune_single_device` with a base builder (no lora_* arguments)
and a LoRAConverter under `model_converters:` trains only the adapters it adds and saves them in the PEFT format.

The reference is PEFT on transformers' LlamaForCausalLM: the saved adapter, loaded by PEFT on the base checkpoint,
computes the same logits as the merged checkpoint the recipe writes, loaded by transformers alone.
"""

import json

import pytest
import torch
import yaml

from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import ASSETS, loss_records, run_recipe

pytestmark = pytest.mark.integration

# the public name is tune.training.LoRAConverter once tune/training/__init__.py exports it
CONVERTER = "tune.training.LoRAConverter"
TARGETS = ["q_proj", "v_proj", "layers.*.mlp.w1"]  # a suffix and a glob over tune's module names
HF_TARGETS = ["gate_proj", "q_proj", "v_proj"]  # the same modules in LlamaForCausalLM


def _config(tmp_path, quantize_base: bool):
    cfg = yaml.safe_load((ASSETS / "lora_tiny.yaml").read_text())
    lora_keys = [k for k in cfg["model"] if k.startswith(("lora_", "apply_lora"))]
    cfg["model"] = {k: v for k, v in cfg["model"].items() if k not in lora_keys}
    cfg["model"]["_component_"] = "tune.models.llama2.llama2"  # the base builder: no adapters of its own
    cfg["model_converters"] = [
        {"_component_": CONVERTER, "target_modules": TARGETS, "rank": 4, "alpha": 8.0, "quantize_base": quantize_base}
    ]
    path = tmp_path / "lora_any_model.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _logits(model, tokens):
    with torch.no_grad():
        return model.eval()(input_ids=tokens).logits


@pytest.mark.parametrize(
    "recipe, quantize_base",
    [
        ("lora_finetune_single_device", False),
        ("lora_finetune_single_device", True),
        ("lora_finetune_distributed", False),
    ],
    ids=["lora", "qlora", "lora-2-ranks"],
)
def test_lora_converter_on_base_builder_trains_and_saves_peft_adapter(tiny_assets, tmp_path, recipe, quantize_base):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    out = tmp_path / "run"
    overrides = [f"assets_dir={tiny_assets}", f"output_dir={out}", "max_steps_per_epoch=3"]
    if recipe == "lora_finetune_distributed":
        run_distributed(recipe, _config(tmp_path, quantize_base), [*overrides, "batch_size=2"], cwd=tmp_path)
    else:
        run_recipe(recipe, _config(tmp_path, quantize_base), overrides, cwd=tmp_path)

    losses = [r["loss"] for r in loss_records(out)]
    print("losses", losses)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]

    step_dir = out / "step_3"
    config = json.loads((step_dir / "adapter" / "adapter_config.json").read_text())
    assert (config["target_modules"], config["r"], config["lora_alpha"]) == (HF_TARGETS, 4, 8.0)

    tokens = torch.randint(3, 320, (2, 16), generator=torch.Generator().manual_seed(0))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    base_logits = _logits(base, tokens)
    if quantize_base:  # the adapters were trained on NF4-rounded base weights, and the merged model holds those
        from tune.modules.peft import dequantize, to_nf4

        with torch.no_grad():
            for name, module in base.named_modules():
                if name.endswith(tuple(HF_TARGETS)):
                    module.weight.copy_(dequantize(to_nf4(module.weight)))
    peft_logits = _logits(PeftModel.from_pretrained(base, step_dir / "adapter"), tokens)
    merged_logits = _logits(LlamaForCausalLM.from_pretrained(step_dir, dtype=torch.float32), tokens)
    assert (peft_logits - base_logits).abs().max() > 1e-3  # the adapters trained
    torch.testing.assert_close(peft_logits, merged_logits, rtol=1e-5, atol=1e-5)
