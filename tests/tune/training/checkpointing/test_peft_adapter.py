import json

import pytest
import torch

from tests.tune.training.checkpointing.tiny_llama import FAMILY, TinyLlama, reference_model
from tune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    MODEL_KEY,
    FullModelHFCheckpointer,
    load_adapter_weights,
)

RANK, ALPHA = 4, 8.0
TOKENS = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))


def _trained_lora_model(base_state, use_dora, modules):
    model = TinyLlama(lora={"rank": RANK, "alpha": ALPHA, "use_dora": use_dora}, lora_modules=modules)
    missing, unexpected = model.load_state_dict(base_state, strict=False)
    assert not unexpected and all(k.endswith(("lora_a.weight", "lora_b.weight", "magnitude")) for k in missing)
    if use_dora:
        for module in model.modules():
            if hasattr(module, "initialize_dora_magnitude"):
                module.initialize_dora_magnitude()
    torch.manual_seed(2)
    with torch.no_grad():  # "training" moved the adapters away from their (output-preserving) initialisation
        for name, param in model.named_parameters():
            if "lora_" in name or "magnitude" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


@pytest.mark.parametrize(
    "use_dora, modules, hf_names",
    [
        (False, ("q_proj", "v_proj"), ["q_proj", "v_proj"]),
        (True, ("k_proj", "output_proj"), ["k_proj", "o_proj"]),
    ],
)
def test_adapter_loads_in_peft_with_equal_logits(hf_dir, tmp_path, use_dora, modules, hf_names):
    import peft

    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    model = _trained_lora_model(ckpt.load_checkpoint()[MODEL_KEY], use_dora, modules)
    state = {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": RANK, "lora_alpha": ALPHA}}
    out = ckpt.save_checkpoint(state, step=5)

    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["use_dora"]) == (RANK, ALPHA, use_dora)
    assert config["target_modules"] == hf_names
    assert config["base_model_name_or_path"] == str(hf_dir.resolve())  # no tune_download.json here

    with torch.no_grad():
        ours = model(TOKENS)
        peft_model = peft.PeftModel.from_pretrained(reference_model(hf_dir), out / "adapter").eval()
        torch.testing.assert_close(peft_model(TOKENS).logits, ours, rtol=1e-5, atol=1e-5)
        # the merged full model was written too, and transformers alone computes the same
        torch.testing.assert_close(reference_model(out)(TOKENS).logits, ours, rtol=1e-5, atol=1e-5)

    # The adapter comes back into a fresh LoRA model (continue training / generate without merging).
    reloaded = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "o2", adapter_checkpoint=out)
    loaded = reloaded.load_checkpoint()
    fresh = TinyLlama(lora={"rank": RANK, "alpha": ALPHA, "use_dora": use_dora}, lora_modules=modules).eval()
    fresh.load_state_dict(loaded[MODEL_KEY], strict=False)
    load_adapter_weights(fresh, loaded[ADAPTER_KEY])
    with torch.no_grad():
        assert torch.equal(fresh(TOKENS), ours)


def test_peft_made_adapter_loads_into_our_lora_model(hf_dir, tmp_path):
    import peft

    base = reference_model(hf_dir)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = peft.get_peft_model(base, config)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    peft_model.save_pretrained(tmp_path / "peft_adapter")
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    model = TinyLlama(lora={"rank": RANK, "alpha": ALPHA}).eval()
    model.load_state_dict(ckpt.load_checkpoint()[MODEL_KEY], strict=False)
    load_adapter_weights(model, ckpt.load_adapter(tmp_path / "peft_adapter"))
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), peft_model.eval()(TOKENS).logits, rtol=1e-5, atol=1e-5)


def test_adapter_only_skips_the_merged_model_and_names_the_downloaded_repo(hf_dir, tmp_path):
    (hf_dir / "tune_download.json").write_text(json.dumps({"repo_id": "org/tiny-llama", "revision": "main"}))
    ckpt = FullModelHFCheckpointer(
        hf_dir, model_type=FAMILY, output_dir=tmp_path / "out", save_adapter_weights_only=True
    )
    model = _trained_lora_model(ckpt.load_checkpoint()[MODEL_KEY], False, ("q_proj", "v_proj"))
    state = {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": RANK, "lora_alpha": ALPHA}}
    out = ckpt.save_checkpoint(state, 1)
    assert not list(out.glob("model*.safetensors"))
    assert (out / "adapter" / "adapter_model.safetensors").is_file() and (out / "config.json").is_file()
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "org/tiny-llama"


def test_adapters_without_alpha_are_refused(hf_dir, tmp_path):
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    model = _trained_lora_model(ckpt.load_checkpoint()[MODEL_KEY], False, ("q_proj",))
    with pytest.raises(ValueError, match="adapter_config"):
        ckpt.save_checkpoint({MODEL_KEY: model.state_dict()}, step=1)


def test_adapter_of_another_rank_names_key_and_shapes(hf_dir, tmp_path):
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    model = _trained_lora_model(ckpt.load_checkpoint()[MODEL_KEY], False, ("q_proj", "v_proj"))
    state = {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": RANK, "lora_alpha": ALPHA}}
    out = ckpt.save_checkpoint(state, 1)
    other = TinyLlama(lora={"rank": 2, "alpha": ALPHA})
    expected = r"Shape mismatch for 'layers.0.attn.q_proj.lora_a.weight': \(4, 32\).*\(2, 32\)"
    with pytest.raises(ValueError, match=expected):
        load_adapter_weights(other, ckpt.load_adapter(out))
    with pytest.raises(ValueError, match="keys the model lacks"):
        load_adapter_weights(
            TinyLlama(lora={"rank": RANK, "alpha": ALPHA}, lora_modules=("k_proj",)), ckpt.load_adapter(out)
        )


def test_resume_takes_the_saved_adapter_not_the_starting_adapter_checkpoint(hf_dir, tmp_path):
    # a LoRA run started from adapter A (adapter_checkpoint) saves adapter B at step 2; resuming must continue
    # from B, as the optimizer state and data position do (it used to reload A: resumed losses drifted)
    base = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "start").load_checkpoint()
    start = _trained_lora_model(base[MODEL_KEY], False, ("q_proj", "v_proj"))
    config = {"r": RANK, "lora_alpha": ALPHA}
    start_dir = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "start").save_checkpoint(
        {MODEL_KEY: start.state_dict(), ADAPTER_CONFIG: config}, step=1
    )
    run = tmp_path / "run"
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=run, adapter_checkpoint=start_dir)
    trained = {k: v + 0.5 if "lora_" in k else v for k, v in start.state_dict().items()}  # the run moved them
    recipe_state = {"rng_state": {"python": None}, "steps_run": 2}
    ckpt.save_checkpoint(
        {MODEL_KEY: trained, ADAPTER_CONFIG: config, **recipe_state}, step=2, intermediate_checkpoint=True
    )
    resumed = FullModelHFCheckpointer(
        hf_dir, model_type=FAMILY, output_dir=run, adapter_checkpoint=start_dir, resume_from_checkpoint=True
    ).load_checkpoint()
    expected = {k: v for k, v in trained.items() if "lora_" in k}
    assert resumed[ADAPTER_KEY].keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(resumed[ADAPTER_KEY][key], value, rtol=0, atol=1e-6)
