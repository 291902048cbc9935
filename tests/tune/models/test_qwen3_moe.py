"""The Qwen3-MoE family against transformers' Qwen3MoeForCausalLM: logits (a dense layer among sparse ones, a
left-padded batch, both expert compute paths), the load-balancing loss, the weight conversion both ways and in
both expert layouts, the checkpointer, and LoRA on attention, router and experts."""

import json

import pytest
import torch

from tests.tune.models._hf_cases import VOCAB, build_hf_model, padded_batch
from tune.models.qwen3_moe import (
    lora_qwen3_moe,
    qlora_qwen3_moe_30b_a3b,
    qwen3_moe_from_hf_config,
    qwen3_moe_hf_to_tune,
    qwen3_moe_tune_to_hf,
)
from tune.modules import get_causal_mask_from_padding_mask
from tune.modules.moe import MoE, moe_aux_loss
from tune.modules.peft import LoRASwiGLUExperts, merge_lora_experts, merge_lora_weights

transformers = pytest.importorskip("transformers")

NUM_EXPERTS, TOP_K = 6, 2


def _hf_config(**overrides):
    # 3 layers, the middle one dense (mlp_only_layers); dims multiples of 4 so the grouped-mm path runs in float32
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=64,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        router_aux_loss_coef=0.001,
    )
    kwargs.update(overrides)
    return transformers.Qwen3MoeConfig(**kwargs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random transformers Qwen3-MoE saved with save_pretrained: (model, directory, config.json dict)."""
    directory = tmp_path_factory.mktemp("qwen3_moe")
    hf_model = build_hf_model(_hf_config())
    hf_model.save_pretrained(directory)
    return hf_model, directory, json.loads((directory / "config.json").read_text())


def _disk_state(directory):
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def _tune_model(config: dict, state: dict, **lora_kwargs):
    model = qwen3_moe_from_hf_config(config, **lora_kwargs)
    missing, unexpected = model.load_state_dict(qwen3_moe_hf_to_tune(state, config), strict=False)
    assert not unexpected and all("lora" in key for key in missing), (missing, unexpected)
    return model.eval()


def _logits(model, tokens, attention_mask, positions):
    mask = get_causal_mask_from_padding_mask(attention_mask.bool())
    return model(tokens, mask=mask, input_pos=positions)


@pytest.mark.parametrize("use_grouped_mm", [False, True])
def test_logits_and_aux_loss_match_transformers_on_a_padded_batch(saved, use_grouped_mm):
    hf_model, directory, config = saved
    model = _tune_model(config, _disk_state(directory))
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [True, False, True]
    for layer in model.layers:
        if isinstance(layer.mlp, MoE):
            layer.mlp.experts.use_grouped_mm = use_grouped_mm
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask, position_ids=positions, output_router_logits=True)
        actual = _logits(model, tokens, attention_mask, positions)
        aux = moe_aux_loss(model, attention_mask)
    real = attention_mask.bool()
    error = (expected.logits[real] - actual[real]).abs().max().item()
    aux_error = (expected.aux_loss - aux).abs().item()
    print(f"grouped_mm={use_grouped_mm}: max abs logit error {error:.2e}, aux loss error {aux_error:.2e}")
    assert expected.logits.abs().max() > 1.0
    assert error < 1e-5
    assert aux_error < 1e-6


def test_conversion_round_trips_exactly_from_both_expert_layouts(saved):
    hf_model, directory, config = saved
    on_disk = _disk_state(directory)  # per-expert tensors, as on the hub and as save_pretrained writes
    in_memory = hf_model.state_dict()  # transformers 5's fused gate_up_proj / down_proj
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in on_disk
    assert "model.layers.0.mlp.experts.gate_up_proj" in in_memory
    from_disk, from_memory = qwen3_moe_hf_to_tune(on_disk, config), qwen3_moe_hf_to_tune(in_memory, config)
    assert sorted(from_disk) == sorted(from_memory)
    for key, value in from_disk.items():
        assert torch.equal(value, from_memory[key]), key
    back = qwen3_moe_tune_to_hf(from_memory, config)
    assert sorted(back) == sorted(on_disk)
    for key, value in on_disk.items():
        assert torch.equal(back[key], value), key


def test_conversion_names_missing_experts(saved):
    _, directory, config = saved
    state = _disk_state(directory)
    del state["model.layers.2.mlp.experts.4.up_proj.weight"]
    with pytest.raises(
        ValueError, match=r"Layer 2's up_proj has 5 of its 6 per-expert tensors \(missing experts \[4\]"
    ):
        qwen3_moe_hf_to_tune(state, config)


@pytest.mark.parametrize("sharded", [False, True])
def test_from_hf_loads_a_per_expert_checkpoint(saved, tmp_path, sharded):
    # the hub's layout: one tensor per expert, grouped per layer and projection by tune.models.from_hf; sharded,
    # each layer's even experts in one file and its odd ones in the other (a group spread over two shards)
    from safetensors.torch import save_file

    from tune.models import from_hf

    hf_model, directory, config = saved
    if sharded:
        state = _disk_state(directory)
        directory = tmp_path / "sharded"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config))
        names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
        weight_map = {key: names[int(key.split(".experts.")[1].split(".")[0]) % 2 if ".experts." in key else 0]
                      for key in state}  # fmt: skip
        for name in names:
            save_file({k: v for k, v in state.items() if weight_map[k] == name}, directory / name)
        index = {"metadata": {}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    model = from_hf(directory, dtype=torch.float32)
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask, position_ids=positions).logits
        actual = _logits(model, tokens, attention_mask, positions)
        lora = from_hf(directory, dtype=torch.float32, lora_attn_modules=["q_proj"], apply_lora_to_experts=True)
        lora_logits = _logits(lora, tokens, attention_mask, positions)
    real = attention_mask.bool()
    error = (expected[real] - actual[real]).abs().max().item()
    print(f"from_hf (sharded={sharded}): max abs logit error {error:.2e}")
    assert error < 1e-5
    assert isinstance(lora.layers[0].mlp.experts, LoRASwiGLUExperts)
    assert (expected[real] - lora_logits[real]).abs().max() < 1e-5  # fresh adapters: B = 0


def test_from_hf_names_the_missing_experts_of_a_checkpoint(saved, tmp_path):
    from safetensors.torch import save_file

    from tune.models import from_hf

    _, directory, config = saved
    state = _disk_state(directory)
    del state["model.layers.0.mlp.experts.2.gate_proj.weight"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"Layer 0's gate_proj has 5 of its 6 per-expert tensors \(missing experts \[2\]"
    ):
        from_hf(tmp_path)


def test_from_hf_config_reads_both_spellings_and_the_layer_pattern(saved):
    _, _, config = saved
    # transformers 5 writes num_local_experts and rope_parameters; the hub's config.json num_experts and rope_theta
    assert "num_local_experts" in config and "rope_parameters" in config
    hub = {k: v for k, v in config.items() if k not in ("num_local_experts", "rope_parameters")}
    hub.update(num_experts=NUM_EXPERTS, rope_theta=1_000_000.0, decoder_sparse_step=2, mlp_only_layers=[])
    for cfg, pattern in ((config, [True, False, True]), (hub, [False, True, False])):
        model = qwen3_moe_from_hf_config(cfg)
        assert [isinstance(layer.mlp, MoE) for layer in model.layers] == pattern
        assert model.layers[0].attn.pos_embeddings.base == 1_000_000.0
        moe = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE))
        assert (moe.experts.num_experts, moe.router.experts_per_token, moe.router.norm_topk_prob) == (6, 2, True)
    scaled = {**hub, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ValueError, match="qwen3_moe: RoPE scaling 'yarn'"):
        qwen3_moe_from_hf_config(scaled)


def test_checkpointer_output_loads_in_transformers_with_the_same_weights(saved, tmp_path):
    from tune.training import FullModelHFCheckpointer

    hf_model, directory, config = saved
    checkpointer = FullModelHFCheckpointer(directory, model_type="qwen3_moe", output_dir=tmp_path / "out")
    state = checkpointer.load_checkpoint()["model"]
    model = qwen3_moe_from_hf_config(config)
    model.load_state_dict(state)
    written = checkpointer.save_checkpoint({"model": model.state_dict()}, step=1)
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(written, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    expected = hf_model.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, expected[key]), key


LORA = dict(
    lora_attn_modules=["q_proj", "v_proj", "output_proj"],
    apply_lora_to_mlp=True,
    apply_lora_to_output=True,
    apply_lora_to_experts=True,
    apply_lora_to_router=True,
    lora_rank=4,
    lora_alpha=8.0,
)


def test_lora_on_experts_starts_at_the_base_and_merges_to_the_unmerged_forward(saved):
    hf_model, directory, config = saved
    state = _disk_state(directory)
    base, lora = _tune_model(config, state), _tune_model(config, state, **LORA)
    assert sum(isinstance(m, LoRASwiGLUExperts) for m in lora.modules()) == 2
    tokens, attention_mask, positions = padded_batch()
    real = attention_mask.bool()
    with torch.no_grad():
        expected = _logits(base, tokens, attention_mask, positions)
        torch.testing.assert_close(_logits(lora, tokens, attention_mask, positions)[real], expected[real])
        generator = torch.Generator().manual_seed(3)
        for name, param in lora.named_parameters():  # a "trained" adapter: every B non-zero
            if "lora_b" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
        unmerged = _logits(lora, tokens, attention_mask, positions)
        assert (unmerged[real] - expected[real]).abs().max() > 1e-2
        merge_lora_weights(merge_lora_experts(lora))
        assert not any("lora" in key for key in lora.state_dict())
        merged = _logits(lora, tokens, attention_mask, positions)
    error = (merged[real] - unmerged[real]).abs().max().item()
    print(f"merged vs unmerged LoRA logits: max abs error {error:.2e}")
    assert error < 1e-5


def test_expert_adapters_are_refused_by_the_hf_converter_with_the_fix(saved):
    _, directory, config = saved
    lora = _tune_model(config, _disk_state(directory), **LORA)
    with pytest.raises(ValueError, match="merge_lora_experts"):
        qwen3_moe_tune_to_hf(lora.state_dict(), config)


def test_qlora_stores_every_expert_in_nf4(saved):
    pytest.importorskip("torchao")
    from tune.modules.peft import is_nf4_tensor

    assert qlora_qwen3_moe_30b_a3b.keywords == {"quantize_base": True}
    _, directory, config = saved
    model = _tune_model(config, _disk_state(directory), lora_attn_modules=["q_proj"], quantize_base=True)
    experts = model.layers[0].mlp.experts
    assert not isinstance(experts, LoRASwiGLUExperts)  # frozen experts are quantised too
    assert all(is_nf4_tensor(getattr(experts, name)) for name in ("gate_proj", "up_proj", "down_proj"))
    assert experts.gate_proj.shape == (NUM_EXPERTS * 32, 64)
    assert not is_nf4_tensor(model.layers[0].mlp.router.gate.weight)
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        assert torch.isfinite(_logits(model, tokens, attention_mask, positions)).all()


def test_lora_builder_refuses_dora_on_experts():
    with pytest.raises(ValueError, match="apply_lora_to_experts=False"):
        lora_qwen3_moe(
            ["q_proj"], use_dora=True, apply_lora_to_experts=True, vocab_size=8, num_layers=1, num_heads=1,
            num_kv_heads=1, embed_dim=8, max_seq_len=8, intermediate_dim=8, moe_intermediate_dim=8, num_experts=2,
            experts_per_token=1,
        )  # fmt: skip
