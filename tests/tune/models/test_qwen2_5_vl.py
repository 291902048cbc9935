"""Qwen2.5-VL (tune.models.qwen2_5_vl) against transformers' ``Qwen2_5_VLForConditionalGeneration`` built from the
same tiny random config: logits with two images of different grids in one row (windowed and full-attention vision
layers both in play), right- and left-padded batches with a text-only row, M-RoPE positions against
``get_rope_index``, the exact weight round trip in both Hugging Face layouts, the trainable choices of the LoRA
builder, and the parameter counts of the released sizes on the meta device."""

import pytest
import torch

from tune.models.qwen2_5_vl import (
    Qwen2_5_VisionLanguageModel,
    lora_qwen2_5_vl,
    mrope_positions,
    qwen2_5_vl_from_hf_config,
    qwen2_5_vl_hf_to_tune,
    qwen2_5_vl_tune_to_hf,
)
from tune.models.qwen2_5_vl._model_builders import MODEL_SIZES
from tune.modules import get_causal_mask_from_padding_mask, get_position_ids_from_padding_mask
from tune.modules.peft import get_adapter_params
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

VOCAB, VISION_START, VISION_END, IMAGE, PAD = 128, 125, 126, 127, 0
MERGE = 2
# head_dim 8: four rotated pairs, one turned by the temporal position, one by the height, two by the width
TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=10_000.0, mrope_section=[1, 1, 2]),
)  # fmt: skip
# 2 x 2-pixel patches, 2 x 2 merge blocks, 8-pixel windows (2 x 2 merge blocks: smaller than every test image);
# layer 1 of 3 attends over whole images
VISION = dict(
    depth=3, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=2, temporal_patch_size=2,
    spatial_merge_size=MERGE, window_size=8, out_hidden_size=32, fullatt_block_indexes=[1],
)  # fmt: skip
PATCH_DIM = 3 * 2 * 2 * 2
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def models():
    config = transformers.Qwen2_5_VLConfig(
        text_config=TEXT, vision_config=VISION, image_token_id=IMAGE, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration(config).float().eval()
    with torch.no_grad():  # random weights everywhere: the initialisation leaves norms at one and biases at zero
        for name, param in hf_model.named_parameters():
            if "norm" in name or "ln_q" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.3 if "embed" in name else 0.15)
    hf_config = config.to_dict()
    model = qwen2_5_vl_from_hf_config(hf_config).eval()
    model.load_state_dict(qwen2_5_vl_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model, hf_config


def _tokens(grid):
    return grid[0] * grid[1] * grid[2] // MERGE**2


def _row(*parts):
    """Token ids from text lengths (ints: random text tokens) and image grids (tuples: the image's tokens between
    vision start and end)."""
    ids = []
    for part in parts:
        if isinstance(part, tuple):
            ids += [VISION_START, *[IMAGE] * _tokens(part), VISION_END]
        else:
            ids += torch.randint(1, 120, (part,)).tolist()
    return ids


def _batch(rows, left=False):
    """Padded tokens [b, s] and the padding mask [b, s] (True: real token)."""
    seq_len = max(len(row) for row in rows)
    tokens = torch.full((len(rows), seq_len), PAD)
    real = torch.zeros(len(rows), seq_len, dtype=torch.bool)
    for i, row in enumerate(rows):
        where = slice(seq_len - len(row), None) if left else slice(0, len(row))
        tokens[i, where], real[i, where] = torch.tensor(row), True
    return tokens, real


def _images(grids):
    grid_thw = torch.tensor(grids)
    return {"pixel_values": torch.randn(int(grid_thw.prod(-1).sum()), PATCH_DIM), "image_grid_thw": grid_thw}


def _hf_logits(hf_model, tokens, real, images):
    with torch.no_grad():
        return hf_model(
            input_ids=tokens, attention_mask=real.long(), mm_token_type_ids=(tokens == IMAGE).int(), **images
        ).logits


def _max_error(expected, actual, real):
    assert expected[real].abs().max() > 1.0  # not a comparison of near-zero logits
    return (expected[real] - actual[real]).abs().max().item()


def test_two_images_of_different_sizes_in_one_row(models):
    hf_model, model, _ = models
    torch.manual_seed(1)
    grids = [(1, 8, 12), (1, 6, 4)]  # 4 x 6 and 3 x 2 merge blocks: six full windows, then a full and a half one
    tokens, real = _batch([_row(3, grids[0], 2, grids[1], 4)])
    images = _images(grids)
    expected = _hf_logits(hf_model, tokens, real, images)
    with torch.no_grad():
        actual = model(tokens, encoder_input=images)
    error = _max_error(expected, actual, real)
    print(f"qwen2.5-vl, two images in a row: max abs logit error {error:.3e}")
    assert error <= TOLERANCE
    # the windows matter: with every vision layer attending over whole images, the logits are others
    windowed_layers = model.encoder.full_attention_layers
    model.encoder.full_attention_layers = tuple(range(len(model.encoder.layers)))
    try:
        with torch.no_grad():
            assert _max_error(expected, model(tokens, encoder_input=images), real) > 1e-2
    finally:
        model.encoder.full_attention_layers = windowed_layers


@pytest.mark.parametrize("left", [False, True], ids=["right_padded", "left_padded"])
def test_padded_batch_with_a_text_only_row(models, left):
    hf_model, model, _ = models
    torch.manual_seed(2)
    grids = [(1, 6, 4), (1, 4, 8), (1, 4, 4)]
    rows = [_row(2, grids[0], 5), _row(12), _row(1, grids[1], 3, grids[2], 1)]
    tokens, real = _batch(rows, left=left)
    images = _images(grids)
    expected = _hf_logits(hf_model, tokens, real, images)
    # as tune's recipes and generation pass padding: a mask and positions from the padding mask
    mask, input_pos = get_causal_mask_from_padding_mask(real), get_position_ids_from_padding_mask(real)
    with torch.no_grad():
        actual = model(tokens, mask=mask, encoder_input=images, input_pos=input_pos)
        if not left:  # right padding needs neither: real tokens see only real tokens and count from 0
            assert torch.equal(model(tokens, encoder_input=images)[real], actual[real])
    error = _max_error(expected, actual, real)
    print(f"qwen2.5-vl, {'left' if left else 'right'}-padded batch: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_text_only_batch(models):
    hf_model, model, _ = models
    torch.manual_seed(3)
    tokens, real = _batch([_row(9), _row(9)])
    with torch.no_grad():
        expected = hf_model(input_ids=tokens).logits
        actual = model(tokens, encoder_mask=torch.ones(1))  # encoder_mask is accepted and unused
    assert _max_error(expected, actual, real) <= TOLERANCE


def test_mrope_positions_match_get_rope_index(models):
    hf_model, _, _ = models
    torch.manual_seed(4)
    grids = [(1, 8, 12), (1, 6, 4), (1, 4, 4)]
    tokens, real = _batch([_row(3, grids[0], 2, grids[1]), _row(4, grids[2], 6)], left=True)
    expected, _ = hf_model.model.get_rope_index(
        tokens, mm_token_type_ids=(tokens == IMAGE).int(), image_grid_thw=torch.tensor(grids), attention_mask=real
    )
    positions = mrope_positions(tokens == IMAGE, torch.tensor(grids), MERGE, get_position_ids_from_padding_mask(real))
    assert torch.equal(positions[:, real], expected[:, real])
    # a packed row: positions restart with each document, and so does the shift of its images
    packed = mrope_positions(
        torch.tensor([[False, True, True, True, True, True, True, False, False, True, True, True, True]]),
        torch.tensor([[1, 4, 6], [1, 4, 4]]),
        MERGE,
        torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]]),
    )
    assert packed[:, 0, 7].tolist() == [4, 4, 4]  # after a 2 x 3 image at 1: 1 + max(2, 3)
    assert packed[:, 0, 8].tolist() == [0, 0, 0]  # the next document starts again
    assert packed[:, 0, 9:].T.tolist() == [[1, 1, 1], [1, 1, 2], [1, 2, 1], [1, 2, 2]]


def test_weight_round_trip_is_exact(models):
    hf_model, model, hf_config = models
    state = model.state_dict()
    hf_state = hf_model.state_dict()
    back = qwen2_5_vl_tune_to_hf(state, hf_config)
    # transformers 5's module tree in the files' layout
    renames = {"model.visual.": "visual.", "model.language_model.": "model.", "lm_head.": "lm_head."}
    expected = {}
    for key, value in hf_state.items():
        prefix = next(p for p in renames if key.startswith(p))
        expected[renames[prefix] + key.removeprefix(prefix)] = value
    assert back.keys() == expected.keys()
    assert all(torch.equal(back[key], expected[key]) for key in expected)
    for source in (back, hf_state):  # the files' layout and the module tree both load
        again = qwen2_5_vl_hf_to_tune(source, hf_config)
        assert again.keys() == state.keys()
        assert all(torch.equal(again[key], state[key]) for key in state)


def test_image_tokens_must_match_the_images(models):
    _, model, _ = models
    tokens = torch.tensor([_row(2, (1, 4, 4))])
    with pytest.raises(ValueError, match="image tokens"):
        model(tokens, encoder_input=_images([(1, 4, 8)]))
    with pytest.raises(ValueError, match="no encoder_input"):
        model(tokens)
    with pytest.raises(ValueError, match="image_grid_thw"):
        model(tokens, encoder_input={"pixel_values": torch.randn(16, PATCH_DIM)})


def test_the_model_passes_the_decoder_settings_through(models):
    _, model, _ = models
    assert model.tok_embeddings is model.decoder.tok_embeddings and model.output is model.decoder.output
    tokens = torch.tensor([_row(2, (1, 4, 4), 3)])
    images = _images([(1, 4, 4)])
    with torch.no_grad():
        logits = model(tokens, encoder_input=images)
        model.skip_output_layer = True
        assert model.decoder.skip_output_layer
        hidden = model(tokens, encoder_input=images)
        model.skip_output_layer = False
        model.set_num_output_chunks(2)
        chunks = model(tokens, encoder_input=images)
        model.set_num_output_chunks(0)
    assert torch.allclose(model.output(hidden).float(), logits, atol=1e-6)
    assert torch.allclose(torch.cat(chunks, dim=1), logits, atol=1e-6)
    model.setup_caches(1, torch.float32, decoder_max_seq_len=32)
    assert model.caches_are_setup() and model.caches_are_enabled()
    model.reset_caches()
    model.delete_caches()
    assert not model.caches_are_setup()


TINY = dict(
    vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, intermediate_dim=48, max_seq_len=64,
    mrope_section=(1, 1, 2), vision_embed_dim=16, vision_num_layers=2, vision_num_heads=2, vision_intermediate_dim=24,
    vision_full_attention_layers=(1,), vision_window_size=8, patch_size=2, image_token_id=IMAGE,
)  # fmt: skip


def _trainable(part):
    return {name for name, param in part.named_parameters() if param.requires_grad}


@pytest.mark.parametrize(
    "decoder, encoder, fusion",
    [("lora", "frozen", "lora"), ("frozen", "lora", "full"), ("full", "full", "frozen")],
)
def test_lora_trainable_choices(decoder, encoder, fusion):
    model = lora_qwen2_5_vl(
        ["q_proj", "v_proj"], apply_lora_to_mlp=True, decoder_trainable=decoder, encoder_trainable=encoder,
        fusion_trainable=fusion, lora_rank=2, **TINY,
    )  # fmt: skip
    parts = {"decoder": model.decoder, "encoder": model.encoder.layers, "fusion": model.encoder.merger}
    for part_name, choice in zip(parts, (decoder, encoder, fusion), strict=True):
        part = parts[part_name]
        adapters = set(get_adapter_params(part))
        everything = {name for name, _ in part.named_parameters()}
        assert bool(adapters) == (choice == "lora"), part_name
        assert _trainable(part) == {"frozen": set(), "lora": adapters, "full": everything}[choice], part_name
    # the patch embedding belongs to the encoder
    assert model.encoder.patch_embed.weight.requires_grad == (encoder == "full")
    with pytest.raises(ValueError, match="decoder_trainable"):
        lora_qwen2_5_vl(["q_proj"], decoder_trainable="partly", **TINY)


def test_fresh_lora_model_computes_what_the_base_model_computes():
    torch.manual_seed(5)
    lora = lora_qwen2_5_vl(
        ["q_proj", "k_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, decoder_trainable="lora",
        encoder_trainable="lora", fusion_trainable="lora", **TINY,
    )  # fmt: skip
    base = get_model_family("qwen2_5_vl").builders["qwen2_5_vl"](**TINY)
    missing, unexpected = base.load_state_dict(lora.state_dict(), strict=False)
    assert not missing and all("lora_" in key for key in unexpected)
    tokens = torch.tensor([_row(2, (1, 4, 8), 3)])
    images = _images([(1, 4, 8)])
    with torch.no_grad():  # LoRA's B starts at zero
        assert torch.allclose(lora(tokens, encoder_input=images), base(tokens, encoder_input=images), atol=1e-5)


# The released config.json files' hyperparameters (flat language-model keys; vision_config), transcribed from the
# Hugging Face hub (no network in the tests).
RELEASED = {
    "Qwen/Qwen2.5-VL-3B-Instruct": dict(
        text=dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                  num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048)),
    "Qwen/Qwen2.5-VL-7B-Instruct": dict(
        text=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                  num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584)),
    "Qwen/Qwen2.5-VL-32B-Instruct": dict(
        text=dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                  num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3456, num_heads=16, out_hidden_size=5120)),
    "Qwen/Qwen2.5-VL-72B-Instruct": dict(
        text=dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3456, num_heads=16, out_hidden_size=8192)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_released_size_has_transformers_parameter_count(name):
    released = RELEASED[MODEL_SIZES[name].repo]
    config = transformers.Qwen2_5_VLConfig(
        text_config=released["text"], vision_config=released["vision"],
        tie_word_embeddings=released["text"]["tie_word_embeddings"],
    )  # fmt: skip
    with torch.device("meta"):
        reference = transformers.Qwen2_5_VLForConditionalGeneration(config)
        model = get_model_family("qwen2_5_vl").builders[name]()
        from_config = qwen2_5_vl_from_hf_config(config.to_dict())
    assert isinstance(model, Qwen2_5_VisionLanguageModel)

    def count(module):
        return sum(p.numel() for p in module.parameters())  # a tied weight once

    assert count(model) == count(reference) == count(from_config)


@pytest.mark.parametrize("projections", [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj"]], ids=["qv", "qkv"])
def test_vision_tower_adapter_exports_to_peft_exactly(models, projections):
    """LoRAs on the vision tower's q/k/v (tune's separate projections) written for PEFT as one LoRA on transformers'
    fused qkv: PEFT's model over transformers' gives the logits of tune's model with those adapters."""
    import copy

    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from tune.models.qwen2_5_vl import qwen2_5_vl_adapter_to_peft

    hf_model, model, hf_config = models
    lora = qwen2_5_vl_from_hf_config(
        hf_config, lora_attn_modules=projections, decoder_trainable="frozen", encoder_trainable="lora",
        fusion_trainable="frozen", lora_rank=2, lora_alpha=3.0,
    ).eval()  # fmt: skip
    missing, _ = lora.load_state_dict(model.state_dict(), strict=False)
    adapters = get_adapter_params(lora)
    assert set(missing) == set(adapters) and all(".encoder." in f".{name}" for name in adapters)
    torch.manual_seed(3)
    with torch.no_grad():
        for param in adapters.values():
            param.normal_(0.0, 0.3)
    rest, peft_state, ranks, alphas = qwen2_5_vl_adapter_to_peft(
        {name: param.detach() for name, param in adapters.items()}, hf_config, lora_alpha=3.0
    )
    assert rest == {} and set(ranks) == {f"model.visual.blocks.{i}.attn.qkv" for i in range(VISION["depth"])}
    config = LoraConfig(
        r=6, lora_alpha=9.0, target_modules=sorted(ranks), rank_pattern=ranks, alpha_pattern=alphas,
        init_lora_weights=False,
    )  # fmt: skip
    peft_model = get_peft_model(copy.deepcopy(hf_model), config).eval()
    result = set_peft_model_state_dict(peft_model, {f"base_model.model.{k}": v for k, v in peft_state.items()})
    assert not [key for key in result.missing_keys if "lora_" in key]
    torch.manual_seed(4)
    grids = [(1, 8, 12), (1, 6, 4)]
    tokens, real = _batch([_row(3, grids[0], 2, grids[1], 4)])
    images = _images(grids)
    expected = _hf_logits(peft_model, tokens, real, images)
    with torch.no_grad():
        actual = lora(tokens, encoder_input=images)
        base = model(tokens, encoder_input=images)
    error = _max_error(expected, actual, real)
    moved = (actual[real] - base[real]).abs().max().item()
    print(f"qwen2.5-vl vision LoRA ({'/'.join(projections)}) through PEFT's qkv: max abs logit error {error:.3e}")
    assert error <= TOLERANCE and moved > 1e-1  # the adapters change the logits far beyond the tolerance


def test_dora_variant_from_config_computes_the_base_model():
    """use_dora through the config.json reader: with magnitudes from the loaded weights and fresh adapters, DoRA on
    the language model, the merger and the vision tower computes the base model's logits."""
    from tune.modules.peft import initialize_dora_magnitudes

    config = transformers.Qwen2_5_VLConfig(
        text_config=TEXT, vision_config=VISION, image_token_id=IMAGE, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    ).to_dict()  # fmt: skip
    torch.manual_seed(0)
    base = qwen2_5_vl_from_hf_config(config).eval()
    dora = qwen2_5_vl_from_hf_config(
        config, lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, use_dora=True,
        decoder_trainable="lora", encoder_trainable="lora", fusion_trainable="lora",
    ).eval()  # fmt: skip
    missing, unexpected = dora.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and set(missing) == set(get_adapter_params(dora))
    assert any(name.endswith("magnitude") for name in missing)
    initialize_dora_magnitudes(dora)
    torch.manual_seed(1)
    grids = [(1, 4, 4)]
    tokens, _ = _batch([_row(2, grids[0], 3)])
    images = _images(grids)
    with torch.no_grad():
        assert (base(tokens, encoder_input=images) - dora(tokens, encoder_input=images)).abs().max() <= 1e-5
