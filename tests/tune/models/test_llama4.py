"""The Llama 4 family against transformers' Llama4ForCausalLM: logits of a tiny model with dense and MoE layers, a
NoPE layer with query temperature tuning, chunked attention (chunk shorter than the sequence), q/k norm and Llama 3
RoPE scaling, on padded and packed batches; the weight conversion both ways (text-only and multimodal checkpoints);
LoRA on attention, shared expert, router and experts."""

import json

import pytest
import torch

from tests.tune.models._hf_cases import VOCAB, build_hf_model, padded_batch
from tune.models.llama4 import (
    llama4_from_hf_config,
    llama4_hf_to_tune,
    llama4_tune_to_hf,
    lora_llama4,
)
from tune.models.llama4._component_builders import Llama4RoPE, Llama4ScaledRoPE
from tune.modules import (
    Llama3ScaledRoPE,
    RotaryPositionalEmbeddings,
    get_block_causal_mask_from_document_ids,
    get_causal_mask_from_padding_mask,
)
from tune.modules.moe import MoE
from tune.modules.peft import LoRASwiGLUExperts, merge_lora_experts, merge_lora_weights

transformers = pytest.importorskip("transformers")

NUM_EXPERTS, TOP_K, CHUNK = 4, 2, 4


def _hf_config(**overrides):
    # 4 layers: MoE every second layer (1, 3), NoPE every fourth (3), chunked attention on the RoPE layers (0-2) with
    # a chunk of 4 tokens; floor_scale 2 makes the NoPE layer's query temperature differ from 1 from position 1 on
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        intermediate_size_mlp=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        interleave_moe_layer_step=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        use_qk_norm=True,
        attention_chunk_size=CHUNK,
        attn_temperature_tuning=True,
        floor_scale=2,
        attn_scale=0.5,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500_000.0,
            factor=16.0,
            low_freq_factor=1.0,
            high_freq_factor=1.0,
            original_max_position_embeddings=8,
        ),
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return transformers.Llama4TextConfig(**kwargs)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random transformers Llama 4 saved with save_pretrained: (model, directory, config.json dict)."""
    directory = tmp_path_factory.mktemp("llama4")
    hf_model = build_hf_model(_hf_config())
    hf_model.save_pretrained(directory)
    return hf_model, directory, json.loads((directory / "config.json").read_text())


def _disk_state(directory):
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def _tune_model(config: dict, state: dict, **lora_kwargs):
    model = llama4_from_hf_config(config, **lora_kwargs)
    missing, unexpected = model.load_state_dict(llama4_hf_to_tune(state, config), strict=False)
    assert not unexpected and all("lora" in key or "magnitude" in key for key in missing), (missing, unexpected)
    return model.eval()


def _right_padded_batch(seed: int = 2):
    """Three rows of 12 tokens, the last two right-padded (to 9 and 5 real tokens)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (3, 12), generator=generator)
    attention_mask = torch.ones(3, 12, dtype=torch.long)
    attention_mask[1, 9:] = 0
    attention_mask[2, 5:] = 0
    return tokens, attention_mask


def _max_error(expected, actual, real) -> float:
    return (expected[real] - actual[real]).abs().max().item()


def test_layers_have_the_llama4_structure(saved):
    _, _, config = saved
    model = llama4_from_hf_config(config)
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [False, True, False, True]
    assert [layer.attn.pos_embeddings is None for layer in model.layers] == [False, False, False, True]
    assert [layer.attn.attention_chunk_size for layer in model.layers] == [CHUNK, CHUNK, CHUNK, None]
    assert [layer.attn.q_norm is not None for layer in model.layers] == [True, True, True, False]
    assert [layer.attn.query_scaling is not None for layer in model.layers] == [False, False, False, True]
    moe = model.layers[1].mlp
    assert moe.shared_expert is not None and moe.experts.weight_inputs
    assert (moe.router.score_func, moe.router.norm_topk_prob, moe.router.experts_per_token) == ("sigmoid", False, 2)
    assert model.layers[0].mlp.w1.out_features == 96 and moe.experts.hidden_dim == 32
    rope = model.layers[0].attn.pos_embeddings
    assert (rope.scale_factor, rope.low_freq_factor, rope.high_freq_factor, rope.old_context_len) == (16, 1, 1, 8)


@pytest.mark.parametrize("use_grouped_mm", [False, True])
def test_logits_match_transformers_on_a_right_padded_batch(saved, use_grouped_mm):
    # every feature at once: chunk 4 < 12 tokens, the NoPE layer's temperature (floor_scale 2), q/k norm, dense
    # and MoE layers, Llama 3 RoPE scaling; the real tokens' logits are compared, with both expert compute paths
    hf_model, directory, config = saved
    model = _tune_model(config, _disk_state(directory))
    for moe in (layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)):
        moe.experts.use_grouped_mm = use_grouped_mm
    tokens, attention_mask = _right_padded_batch()
    real = attention_mask.bool()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask).logits
        actual = model(tokens, mask=get_causal_mask_from_padding_mask(real))
        unmasked = model(tokens[:1])
    error = _max_error(expected, actual, real)
    print(f"right-padded batch, grouped_mm={use_grouped_mm}: max abs logit error {error:.2e}")
    assert expected.abs().max() > 1.0
    assert error < 1e-5
    assert _max_error(expected[:1], unmasked, real[:1]) < 1e-5  # no mask: the chunks from token indices


def test_logits_match_transformers_on_a_left_padded_batch(saved):
    # transformers starts the chunks after each row's left padding, as tune does from the positions. Its query
    # temperature counts padding positions too, tune's the token's position in its sequence (so a packed document
    # sees what it would alone): with the release's floor_scale (8192) the two agree on any short batch
    hf_model, directory, config = saved
    hf_model = build_hf_model(_hf_config(floor_scale=8192))
    model = _tune_model({**config, "floor_scale": 8192}, hf_model.state_dict())
    tokens, attention_mask, positions = padded_batch()
    real = attention_mask.bool()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask, position_ids=positions).logits
        actual = model(tokens, mask=get_causal_mask_from_padding_mask(real), input_pos=positions)
    error = _max_error(expected, actual, real)
    print(f"left-padded batch: max abs logit error {error:.2e}")
    assert error < 1e-5


def test_packed_documents_match_each_document_alone(saved):
    # two documents of 7 and 5 tokens in one row: the chunks restart with each document (positions restart), the
    # block-causal mask keeps them apart, and each document's logits are transformers' for it alone
    hf_model, directory, config = saved
    model = _tune_model(config, _disk_state(directory))
    generator = torch.Generator().manual_seed(4)
    first, second = (
        torch.randint(3, VOCAB, (1, 7), generator=generator),
        torch.randint(3, VOCAB, (1, 5), generator=generator),
    )
    packed = torch.cat((first, second), dim=1)
    document_ids = torch.tensor([[0] * 7 + [1] * 5])
    positions = torch.cat((torch.arange(7), torch.arange(5)))[None]
    with torch.no_grad():
        actual = model(packed, mask=get_block_causal_mask_from_document_ids(document_ids), input_pos=positions)
        expected = torch.cat((hf_model(first).logits, hf_model(second).logits), dim=1)
    error = (expected - actual).abs().max().item()
    print(f"packed documents: max abs logit error {error:.2e}")
    assert error < 1e-5


def test_rope_computed_on_the_fly_equals_the_table_and_stays_float32():
    # Scout's 10M positions would make RoPE tables of 10.7 GB: Llama 4's RoPE computes the same angles per call
    x = torch.randn(2, 5, 3, 16, generator=torch.Generator().manual_seed(6))
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 900, 901, 902, 63_999]])
    scaling = dict(scale_factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0, old_context_len=8192)
    cases = [
        (Llama4RoPE(16, 10_485_760, 500_000.0), RotaryPositionalEmbeddings(16, 64_000, 500_000.0)),
        (Llama4ScaledRoPE(16, 10_485_760, 500_000.0, **scaling), Llama3ScaledRoPE(16, 64_000, 500_000.0, **scaling)),
    ]
    for ours, table in cases:
        assert not any(buffer.numel() > 8 for buffer in ours.buffers())  # no table
        for input_pos in (None, positions):
            assert torch.equal(ours(x, input_pos=input_pos), table(x, input_pos=input_pos))
        ours.to(torch.bfloat16)
        assert ours.inv_freq.dtype == torch.float32
        assert torch.equal(
            ours(x.bfloat16(), input_pos=positions), table.to(torch.bfloat16)(x.bfloat16(), input_pos=positions)
        )
    with torch.device("meta"):
        meta = Llama4ScaledRoPE(16, 10_485_760, 500_000.0, **scaling)
    meta.to_empty(device="cpu")  # to_empty recomputes the frequencies
    torch.testing.assert_close(meta.inv_freq, cases[1][0].inv_freq, rtol=0, atol=0)


def test_kv_cache_decoding_matches_the_full_forward(saved):
    # with a KV cache the chunks and the query temperature follow the token index in the cache: a prefill of 5
    # tokens, then one token at a time, gives the logits of one pass over all 12 (chunk 4: every boundary crossed)
    _, directory, config = saved
    model = _tune_model(config, _disk_state(directory))
    tokens = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(tokens)
        model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=16)
        steps = [model(tokens[:, :5])] + [model(tokens[:, i : i + 1]) for i in range(5, 12)]
    error = (torch.cat(steps, dim=1) - expected).abs().max().item()
    print(f"KV-cache decoding: max abs logit error {error:.2e}")
    assert error < 1e-5


def test_conversion_round_trips_exactly(saved):
    hf_model, directory, config = saved
    on_disk = _disk_state(directory)
    assert on_disk["model.layers.1.feed_forward.experts.gate_up_proj"].shape == (NUM_EXPERTS, 64, 64)
    assert on_disk["model.layers.1.feed_forward.experts.down_proj"].shape == (NUM_EXPERTS, 32, 64)
    converted = llama4_hf_to_tune(on_disk, config)
    assert converted["layers.1.mlp.experts.gate_proj"].shape == (NUM_EXPERTS, 32, 64)
    assert converted["layers.1.mlp.experts.down_proj"].shape == (NUM_EXPERTS, 64, 32)
    # q/k rows are permuted per head (interleaved pairs -> halves): row 1 of tune's head 0 is HF's row 2
    q_hf, q_tune = on_disk["model.layers.0.self_attn.q_proj.weight"], converted["layers.0.attn.q_proj.weight"]
    assert torch.equal(q_tune[1], q_hf[2]) and torch.equal(q_tune[8], q_hf[1]) and torch.equal(q_tune[16], q_hf[16])
    back = llama4_tune_to_hf(converted, config)
    assert sorted(back) == sorted(on_disk)
    for key, value in on_disk.items():
        assert torch.equal(back[key], value), key


def test_multimodal_checkpoint_loads_the_language_model_and_writes_it_back(saved):
    # Llama4ForConditionalGeneration's layout (the hub's releases): language_model.{model.*, lm_head.*} next to the
    # vision model and the projector, the text settings in text_config
    import re

    from tune.models.llama4 import LLAMA4_PASSTHROUGH_KEYS

    _, directory, config = saved
    text = _disk_state(directory)
    real = transformers.Llama4Config(text_config=_hf_config(), vision_config={"hidden_size": 16})
    with torch.device("meta"):
        reference = transformers.Llama4ForConditionalGeneration(real).state_dict()
    multimodal = {f"language_model.{key}": value for key, value in text.items()}
    assert set(multimodal) == {key for key in reference if key.startswith("language_model.")}
    vision = [key for key in reference if not key.startswith("language_model.")]
    assert vision and all(re.match(LLAMA4_PASSTHROUGH_KEYS, key) for key in vision)
    multimodal.update({key: torch.zeros(1) for key in vision})
    mm_config = {"model_type": "llama4", "text_config": {k: v for k, v in config.items() if k != "model_type"}}
    converted = llama4_hf_to_tune(multimodal, mm_config)
    reference_text = llama4_hf_to_tune(text, config)
    assert converted.keys() == reference_text.keys()
    assert all(torch.equal(value, reference_text[key]) for key, value in converted.items())
    back = llama4_tune_to_hf(converted, mm_config)
    assert set(back) == {key for key in multimodal if key.startswith("language_model.")}
    assert all(torch.equal(value, multimodal[key]) for key, value in back.items())
    model = llama4_from_hf_config(mm_config)
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [False, True, False, True]
    with pytest.raises(ValueError, match="neither a language-model nor a vision weight"):
        llama4_hf_to_tune({"model.layers.0.input_layernorm.weight": torch.zeros(1)}, mm_config)


def test_from_hf_config_reads_published_layouts(saved):
    _, _, config = saved
    # the hub's config.json: rope_scaling + rope_theta (transformers 4 keys), explicit moe_layers, 0/1 NoPE flags
    hub = {k: v for k, v in config.items() if k != "rope_parameters"}
    hub.update(
        rope_theta=500_000.0,
        rope_scaling=None,
        moe_layers=[0, 2],
        no_rope_layers=[0, 1, 1, 1],
        use_qk_norm=False,
    )
    model = llama4_from_hf_config(hub)
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [True, False, True, False]
    assert [layer.attn.pos_embeddings is None for layer in model.layers] == [True, False, False, False]
    assert all(layer.attn.q_norm is None for layer in model.layers)
    assert type(model.layers[1].attn.pos_embeddings) is Llama4RoPE  # unscaled
    with pytest.raises(ValueError, match="no_rope_layers has 3 entries for 4 layers"):
        llama4_from_hf_config({**hub, "no_rope_layers": [1, 1, 0]})
    with pytest.raises(ValueError, match="attention_bias=true"):
        llama4_from_hf_config({**hub, "attention_bias": True})


LORA = dict(
    lora_attn_modules=["q_proj", "k_proj", "v_proj", "output_proj"],
    apply_lora_to_mlp=True,
    apply_lora_to_output=True,
    apply_lora_to_experts=True,
    apply_lora_to_router=True,
    lora_rank=4,
    lora_alpha=8.0,
)


def test_lora_starts_at_the_base_and_merges_to_the_unmerged_forward(saved):
    hf_model, directory, config = saved
    state = _disk_state(directory)
    base, lora = _tune_model(config, state), _tune_model(config, state, **LORA)
    assert sum(isinstance(m, LoRASwiGLUExperts) for m in lora.modules()) == 2
    assert all(m.weight_inputs for m in lora.modules() if isinstance(m, LoRASwiGLUExperts))
    tokens, attention_mask = _right_padded_batch()
    real = attention_mask.bool()
    mask = get_causal_mask_from_padding_mask(real)
    with torch.no_grad():
        expected = base(tokens, mask=mask)
        torch.testing.assert_close(lora(tokens, mask=mask)[real], expected[real])
        generator = torch.Generator().manual_seed(3)
        for name, param in lora.named_parameters():  # a "trained" adapter: every B non-zero
            if "lora_b" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
        unmerged = lora(tokens, mask=mask)
        assert _max_error(unmerged, expected, real) > 1e-2
        merge_lora_weights(merge_lora_experts(lora))
        merged = lora(tokens, mask=mask)
        # the merged q/k weights go through the RoPE permutation and back like any weight
        back = llama4_tune_to_hf(lora.state_dict(), config)
    error = _max_error(merged, unmerged, real)
    print(f"merged vs unmerged LoRA logits: max abs error {error:.2e}")
    assert error < 1e-5
    hf_model = build_hf_model(_hf_config())
    hf_model.load_state_dict(back)
    with torch.no_grad():
        exported = hf_model(tokens, attention_mask=attention_mask).logits
    assert _max_error(exported, merged, real) < 1e-5


def test_expert_adapters_are_refused_by_the_hf_converter_with_the_fix(saved):
    _, directory, config = saved
    lora = _tune_model(config, _disk_state(directory), **LORA)
    with pytest.raises(ValueError, match="merge_lora_experts"):
        llama4_tune_to_hf(lora.state_dict(), config)


def test_lora_builder_refuses_dora_on_experts():
    with pytest.raises(ValueError, match="apply_lora_to_experts=False"):
        lora_llama4(
            ["q_proj"], use_dora=True, apply_lora_to_experts=True, vocab_size=8, num_layers=1, num_heads=1,
            num_kv_heads=1, embed_dim=8, max_seq_len=8, intermediate_dim=8, moe_intermediate_dim=8, num_experts=2,
        )  # fmt: skip
