"""Weights written by torchtune's FullModelTorchTuneCheckpointer load into tune's models correctly.

torchtune's layout is made here the way torchtune makes it: a tiny Hugging Face checkpoint of each family goes
through torchtune 0.6.1's own weight converters (``torchtune/models/convert_weights.py`` and the family
converters), read from torchtune's published wheel (the session fixture downloads it once), dispatched as
torchtune's ``FullModelHFCheckpointer.load_checkpoint`` does, and saved with ``torch.save`` under the file name
torchtune's ``FullModelTorchTuneCheckpointer`` writes. The reference for the loaded model is ``transformers``
on the original checkpoint.
"""

import importlib.util
import json
import sys
import types
import zipfile
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes import _family_assets as assets
from tests.recipes.test_torchtune_published_configs import torchtune_wheel  # noqa: F401 - the session fixture
from tune.modules.peft import get_adapter_params
from tune.registry import get_model_family
from tune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    MODEL_KEY,
    CheckpointError,
    FullModelTorchTuneCheckpointer,
    load_adapter_weights,
)
from tune.training.checkpointing._checkpointer import _heads_from_sizes

TORCHTUNE_FILE = "model-00001-of-00001.bin"  # torchtune's FullModelTorchTuneCheckpointer output name
# torchtune 0.6.1 families; its converter for each (FullModelHFCheckpointer.load_checkpoint's dispatch)
FAMILIES = ["llama2", "code_llama2", "llama3", "llama3_1", "llama3_2", "mistral", "gemma2", "qwen2_5", "phi3"]


@pytest.fixture(scope="module")
def torchtune_converters(torchtune_wheel):  # noqa: F811
    """torchtune's converter modules, executed from the wheel without importing the rest of torchtune."""
    modules = {}
    with zipfile.ZipFile(torchtune_wheel) as wheel:
        sources = {
            name: wheel.read(f"torchtune/models/{path}").decode()
            for name, path in [
                ("convert_weights", "convert_weights.py"),
                ("qwen2", "qwen2/_convert_weights.py"),
                ("phi3", "phi3/_convert_weights.py"),
                ("gemma2", "gemma2/_convert_weights.py"),
            ]
        }
    package = types.ModuleType("torchtune")
    models = types.ModuleType("torchtune.models")
    with mock.patch.dict(sys.modules, {"torchtune": package, "torchtune.models": models}):
        for name, source in sources.items():
            module_name = f"torchtune.models.{name}"
            spec = importlib.util.spec_from_loader(module_name, loader=None)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            exec(compile(source, f"torchtune/models/{name}", "exec"), module.__dict__)  # noqa: S102
            modules[name] = module
    return modules


def _torchtune_state_dict(converters, family: str, hf_state: dict, config) -> dict:
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    if family == "qwen2_5":
        return converters["qwen2"].qwen2_hf_to_tune(
            hf_state, heads, kv_heads, dim, tie_word_embeddings=config.tie_word_embeddings
        )
    if family == "phi3":  # torchtune passes the head counts for grouped-query attention only
        gqa = heads != kv_heads
        return converters["phi3"].phi3_hf_to_tune(
            hf_state, num_heads=heads if gqa else None, num_kv_heads=kv_heads if gqa else None, dim=dim if gqa else None
        )
    if family == "gemma2":
        return converters["gemma2"].gemma2_hf_to_tune(hf_state, heads, kv_heads, dim, head_dim=config.head_dim)
    return converters["convert_weights"].hf_to_tune(hf_state, heads, kv_heads, dim, getattr(config, "head_dim", None))


def _tune_model(family: str, **lora):
    spec = assets.FAMILIES[family]
    module = importlib.import_module(f"tune.models.{spec.builder_module}")
    builder = getattr(module, f"lora_{spec.builder}" if lora else spec.builder)
    return builder(**assets.tune_dims(family), **lora)


def _write_torchtune_checkpoint(converters, family, root, with_config=True):
    """(directory in torchtune's layout, its state dict, the transformers model it came from)."""
    hf_model = assets.build_hf_model(assets.hf_config(family), seed=0)
    hf_model.save_pretrained(root / "hf", safe_serialization=True)
    hf_state = load_file(root / "hf" / "model.safetensors")  # what torchtune reads: tied weights not repeated
    state = _torchtune_state_dict(converters, family, hf_state, hf_model.config)
    directory = root / "torchtune"
    directory.mkdir()
    torch.save(state, directory / TORCHTUNE_FILE)
    if with_config:  # a checkpoint directory that keeps the model's config.json, as torchtune's HF downloads do
        (directory / "config.json").write_text((root / "hf" / "config.json").read_text())
    return directory, state, hf_model


def _checkpointer(directory, family, out, **kwargs):
    return FullModelTorchTuneCheckpointer(
        directory, [TORCHTUNE_FILE], model_type=family.upper(), output_dir=out, **kwargs
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_torchtune_layout_loads_with_transformers_logits_and_is_written_back_unchanged(
    torchtune_converters, tmp_path, family
):
    directory, state, hf_model = _write_torchtune_checkpoint(torchtune_converters, family, tmp_path)
    assert any(key.endswith(".scale") for key in state)  # torchtune's layout indeed
    checkpointer = _checkpointer(directory, family, tmp_path / "out")
    model = _tune_model(family)
    model.load_state_dict(checkpointer.load_checkpoint()[MODEL_KEY])  # strict: every key maps
    tokens = torch.randint(0, assets.vocab_size(family), (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(tokens).logits, rtol=1e-5, atol=1e-5)
    # the output keeps the input's format: torchtune's names and row order, bit for bit
    out = checkpointer.save_checkpoint({MODEL_KEY: model.state_dict()}, epoch=0)
    (weights,) = out.glob("*.safetensors")  # tune's file choice (safetensors), torchtune's keys
    written = load_file(weights)
    assert written.keys() == state.keys()
    assert all(torch.equal(written[key], state[key]) for key in state)


def test_torchtune_layout_lora_adapter_round_trip(torchtune_converters, tmp_path):
    family = "llama3_2"  # interleaved RoPE in torchtune: the adapter's q/k LoRA B rows are permuted too
    directory, _, _ = _write_torchtune_checkpoint(torchtune_converters, family, tmp_path, with_config=False)
    (directory / "params.json").write_text(
        json.dumps({"dim": assets.EMBED_DIM, "n_heads": assets.NUM_HEADS, "n_kv_heads": assets.NUM_KV_HEADS})
    )
    checkpointer = _checkpointer(directory, family, tmp_path / "out")
    lora = {"lora_attn_modules": ["q_proj", "k_proj", "v_proj"], "lora_rank": 4, "lora_alpha": 8.0}
    model = _tune_model(family, **lora)
    model.load_state_dict(checkpointer.load_checkpoint()[MODEL_KEY], strict=False)
    with torch.no_grad():
        for param in get_adapter_params(model).values():
            param.normal_(std=0.1)
    state = {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": 4, "lora_alpha": 8.0}}
    out = checkpointer.save_checkpoint(state, epoch=0)
    written = load_file(out / "adapter" / "adapter_model.safetensors")
    ours = get_adapter_params(model)
    q_b = "layers.0.attn.q_proj.lora_b.weight"
    assert not torch.equal(written[q_b], ours[q_b])  # written in torchtune's row order ...
    assert torch.equal(written["layers.0.attn.v_proj.lora_b.weight"], ours["layers.0.attn.v_proj.lora_b.weight"])
    # ... and read back into tune's
    again = _checkpointer(directory, family, tmp_path / "out2", adapter_checkpoint=out / "adapter")
    loaded = again.load_checkpoint()
    assert all(torch.equal(loaded[ADAPTER_KEY][key], value) for key, value in ours.items())
    fresh = _tune_model(family, **lora)
    fresh.load_state_dict(loaded[MODEL_KEY], strict=False)
    load_adapter_weights(fresh, loaded[ADAPTER_KEY])
    # the merged model, written in torchtune's layout, computes what base + adapter does
    merged = _tune_model(family)
    written_model = FullModelTorchTuneCheckpointer(out, model_type=family, output_dir=tmp_path / "out3")
    merged.load_state_dict(written_model.load_checkpoint()[MODEL_KEY])
    tokens = torch.arange(24)[None]
    with torch.no_grad():
        expected = model(tokens)
        torch.testing.assert_close(fresh(tokens), expected)
        torch.testing.assert_close(merged(tokens), expected, rtol=1e-5, atol=1e-5)


def test_torchtune_layout_without_head_counts_is_a_clear_error(torchtune_converters, tmp_path, caplog):
    directory, state, _ = _write_torchtune_checkpoint(torchtune_converters, "llama3_2", tmp_path, with_config=False)
    checkpointer = _checkpointer(directory, "llama3_2", tmp_path / "out")
    with pytest.raises(CheckpointError, match="config.json.*num_attention_heads"):
        checkpointer.load_checkpoint()
    # without model_type the layout cannot be known (a user's own family may name parameters `scale`): read as is
    unnamed = FullModelTorchTuneCheckpointer(directory, [TORCHTUNE_FILE], output_dir=tmp_path / "out2")
    assert unnamed.load_checkpoint()[MODEL_KEY].keys() == state.keys()
    assert "set `checkpointer.model_type`" in caplog.text


def test_head_counts_of_a_released_size_come_from_the_family_table():
    # Llama 3.2 1B (32 heads, 8 KV heads, head_dim 64) vs 3B (24, 8, 128): shapes alone tell them apart
    family = get_model_family("llama3_2")
    for builder, expected in [("llama3_2_1b", (32, 8)), ("llama3_2_3b", (24, 8))]:
        with torch.device("meta"):
            state = family.builders[builder]().state_dict()
        assert _heads_from_sizes(family, state) == expected
    assert _heads_from_sizes(family, {"layers.0.attn.q_proj.weight": torch.empty(8, 4)}) is None
