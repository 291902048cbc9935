"""Llama 3.2 Vision (tune.models.llama3_2_vision) against transformers' ``MllamaForConditionalGeneration``: logits
with one tiled image, a padded batch with several images, aspect ratios and a text-only row, text-only batches;
the exact weight round trip; the LoRA builders' trainable parts; cached decoding; parameter counts of the
released sizes.

Two known differences between transformers 5.23 and Meta's reference implementation (which tune follows) are
kept out of the comparisons, each said where it matters: the encoder's intermediate outputs (tune takes the tokens
entering layer ``i``, transformers 5.23 those leaving it, so the reference is built with each index minus one), and
text tokens with no image to attend (left unchanged by tune; transformers 5.23 lets their attention branch through:
they are compared with transformers' text-only forward instead).
"""

import pytest
import torch

from tune.models.llama3_2_vision import (
    llama3_2_vision_11b,
    llama3_2_vision_90b,
    llama3_2_vision_from_hf_config,
    llama3_2_vision_hf_to_tune,
    llama3_2_vision_tune_to_hf,
    lora_llama3_2_vision_11b,
)
from tune.modules.model_fusion import FusionLayer, get_fusion_params
from tune.modules.peft import LoRALinear, get_adapter_params
from tune.registry import family_for_hf_model_type, get_model_family

transformers = pytest.importorskip("transformers")

VOCAB, IMAGE = 64, 64  # <|image|> is the first token after the vocabulary, as in the releases
TILE, PATCH, MAX_TILES = 28, 14, 4
TOKENS_PER_TILE = (TILE // PATCH) ** 2 + 1
RATIOS = [(h, w) for h in range(1, MAX_TILES + 1) for w in range(1, MAX_TILES + 1) if h * w <= MAX_TILES]
# 5 self-attention layers with a cross-attention layer before the 2nd and the 4th (tune: fusion_interval 2)
TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=7, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, cross_attention_layers=[1, 4], pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
    rope_parameters=dict(rope_type="llama3", rope_theta=500_000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=8192),
)  # fmt: skip
VISION = dict(
    hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_global_layers=2, attention_heads=2,
    image_size=TILE, patch_size=PATCH, max_num_tiles=MAX_TILES, intermediate_layers_indices=[1, 2],
    vision_output_dim=48,
)  # fmt: skip
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def models():
    config = transformers.MllamaConfig(text_config=TEXT, vision_config=VISION, image_token_index=IMAGE)
    hf_config = config.to_dict()
    # transformers 5.23 concatenates the outputs of the listed layers, Meta's model (and tune) their inputs
    reference_vision = {**VISION, "intermediate_layers_indices": [i - 1 for i in VISION["intermediate_layers_indices"]]}
    reference_config = transformers.MllamaConfig(
        text_config=TEXT, vision_config=reference_vision, image_token_index=IMAGE
    )
    torch.manual_seed(0)
    hf_model = transformers.MllamaForConditionalGeneration(reference_config).float().eval()
    with torch.no_grad():  # random weights everywhere: gates start at zero and norms at one otherwise
        for name, param in hf_model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif "gate" in name:
                param.copy_(torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
    model = llama3_2_vision_from_hf_config(hf_config).eval()
    model.load_state_dict(llama3_2_vision_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model, hf_config


def _images(grids_per_row):
    """tune's and transformers' image inputs for rows of tile grids (``(h, w)``), padded to the most images."""
    batch_size, num_images = len(grids_per_row), max(len(row) for row in grids_per_row)
    images = torch.zeros(batch_size, num_images, MAX_TILES, 3, TILE, TILE)
    aspect_ratio = torch.ones(batch_size, num_images, 2, dtype=torch.long)  # padding images: any grid
    aspect_ratio_ids = torch.zeros(batch_size, num_images, dtype=torch.long)
    aspect_ratio_mask = torch.zeros(batch_size, num_images, MAX_TILES, dtype=torch.long)
    aspect_ratio_mask[:, :, 0] = 1  # as transformers' image processor pads
    for row, grids in enumerate(grids_per_row):
        for index, (h, w) in enumerate(grids):
            images[row, index, : h * w] = torch.randn(h * w, 3, TILE, TILE)
            aspect_ratio[row, index] = torch.tensor([h, w])
            aspect_ratio_ids[row, index] = RATIOS.index((h, w)) + 1
            aspect_ratio_mask[row, index, : h * w] = 1
    ours = {"images": images, "aspect_ratio": aspect_ratio}
    theirs = dict(pixel_values=images, aspect_ratio_ids=aspect_ratio_ids, aspect_ratio_mask=aspect_ratio_mask)
    return ours, theirs


def _cross_attention_mask(tokens, grids_per_row, num_images):
    """transformers' [b, s, images, tiles] mask (each image from its token until the next one's, the last to the
    end) and tune's [b, s, images * tiles * tokens_per_tile] ``encoder_mask``."""
    batch_size, seq_len = tokens.shape
    mask = torch.zeros(batch_size, seq_len, num_images, MAX_TILES, dtype=torch.long)
    for row, grids in enumerate(grids_per_row):
        starts = (tokens[row] == IMAGE).nonzero().flatten().tolist()
        for index, (h, w) in enumerate(grids):
            end = starts[index + 1] if index + 1 < len(starts) else seq_len
            mask[row, starts[index] : end, index, : h * w] = 1
    encoder_mask = mask.bool().repeat_interleave(TOKENS_PER_TILE, dim=3).reshape(batch_size, seq_len, -1)
    return mask, encoder_mask


def _text(length):
    return torch.randint(3, VOCAB, (length,)).tolist()


def test_one_image_with_three_tiles(models):
    hf_model, model, _ = models
    torch.manual_seed(1)
    grids = [[(1, 3)]]
    tokens = torch.tensor([[IMAGE, *_text(9)]])
    ours, theirs = _images(grids)
    mask, encoder_mask = _cross_attention_mask(tokens, grids, 1)
    with torch.no_grad():
        expected = hf_model(input_ids=tokens, cross_attention_mask=mask, **theirs).logits
        actual = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
    assert expected.abs().max() > 1.0
    error = (expected - actual).abs().max().item()
    print(f"llama3_2_vision, one image of 3 tiles: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_padded_batch_with_images_of_different_grids_and_a_text_only_row(models):
    hf_model, model, _ = models
    torch.manual_seed(2)
    grids = [[(2, 2), (1, 2)], [(2, 1)], []]
    rows = [
        [IMAGE, *_text(3), IMAGE, *_text(6)],
        [IMAGE, *_text(8), 0, 0],  # right-padded
        _text(11),
    ]
    tokens = torch.tensor(rows)
    ours, theirs = _images(grids)
    mask, encoder_mask = _cross_attention_mask(tokens, grids, num_images=2)
    with torch.no_grad():
        expected = hf_model(input_ids=tokens, cross_attention_mask=mask, **theirs).logits
        actual = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
        # the text-only row attends no image: as transformers' forward of that row without images
        expected_text = hf_model(input_ids=tokens[2:]).logits
    error = max((expected[0] - actual[0]).abs().max(), (expected[1, :9] - actual[1, :9]).abs().max())
    text_error = (expected_text[0] - actual[2]).abs().max()
    print(f"llama3_2_vision, padded batch: max abs logit error {error:.3e}, text-only row {text_error:.3e}")
    assert error <= TOLERANCE and text_error <= TOLERANCE
    assert (expected_text[0] - expected[2]).abs().max() > 1e-3  # transformers 5.23's leak, see the module docstring


def test_text_before_the_first_image_is_unchanged_by_it(models):
    hf_model, model, _ = models
    torch.manual_seed(3)
    grids = [[(2, 2)]]
    tokens = torch.tensor([[*_text(4), IMAGE, *_text(5)]])
    ours, _ = _images(grids)
    _, encoder_mask = _cross_attention_mask(tokens, grids, 1)
    with torch.no_grad():
        actual = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
        expected_prefix = hf_model(input_ids=tokens[:, :4]).logits
    assert (actual[:, :4] - expected_prefix).abs().max() <= TOLERANCE


def test_text_only_batch(models):
    hf_model, model, _ = models
    torch.manual_seed(4)
    tokens = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        expected = hf_model(input_ids=tokens).logits
        actual = model(tokens)
    assert (expected - actual).abs().max() <= TOLERANCE


def _files_layout(tree_state):
    """transformers 5's module-tree keys -> the files' keys (as the released safetensors hold them)."""
    renames = (
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_model.", "vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )
    out = {}
    for key, value in tree_state.items():
        for old, new in renames:
            if key.startswith(old):
                out[new + key.removeprefix(old)] = value
                break
    return out


def test_state_dict_round_trips_exactly(models):
    hf_model, model, hf_config = models
    tree = hf_model.state_dict()
    files = _files_layout(tree)
    assert len(files) == len(tree)
    ours = model.state_dict()
    back = llama3_2_vision_tune_to_hf(ours, hf_config)
    assert back.keys() == files.keys()
    assert all(torch.equal(back[key], files[key]) for key in files)
    for hf_state in (tree, files):
        again = llama3_2_vision_hf_to_tune(hf_state, hf_config)
        assert again.keys() == ours.keys()
        assert all(torch.equal(again[key], ours[key]) for key in ours)


def test_cached_decoding_matches_the_full_forward(models):
    _, model, _ = models
    torch.manual_seed(5)
    grids = [[(1, 2)], [(2, 2)]]
    tokens = torch.tensor([[IMAGE, *_text(8)], [IMAGE, *_text(8)]])
    ours, _ = _images(grids)
    _, encoder_mask = _cross_attention_mask(tokens, grids, 1)
    with torch.no_grad():
        full = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
        model.setup_caches(2, torch.float32, decoder_max_seq_len=16)
        try:
            prompt = model(tokens[:, :6], encoder_input=ours, encoder_mask=encoder_mask[:, :6])
            steps = [model(tokens[:, i : i + 1], encoder_mask=encoder_mask[:, i : i + 1]) for i in range(6, 9)]
        finally:
            model.delete_caches()
    assert not model.caches_are_setup()
    assert (prompt - full[:, :6]).abs().max() <= TOLERANCE
    assert (torch.cat(steps, dim=1) - full[:, 6:]).abs().max() <= TOLERANCE


def test_family_is_registered():
    family = get_model_family("LLAMA3_VISION")  # torchtune's model_type
    assert family.name == "llama3_2_vision" and family_for_hf_model_type("mllama") is family
    assert {"llama3_2_vision_11b", "lora_llama3_2_vision_90b", "qlora_llama3_2_vision_11b"} <= set(family.builders)


def test_lora_builder_trains_the_chosen_parts():
    with torch.device("meta"):
        model = lora_llama3_2_vision_11b(
            ["q_proj", "v_proj"], decoder_trainable="frozen", encoder_trainable="lora", fusion_trainable="full"
        )
    adapters = get_adapter_params(model)
    fusion = get_fusion_params(model)
    assert adapters and all(name.startswith("encoder.clip.layers.") for name in adapters)
    assert all(p.requires_grad for p in adapters.values()) and all(p.requires_grad for p in fusion.values())
    assert any(name.startswith("encoder.clip.global_layers.") for name in fusion)
    assert any(".fusion_layer." in name for name in fusion)
    assert "decoder.tok_embeddings.fusion_embedding.weight" in fusion and "encoder.projection.output.weight" in fusion
    for name, param in model.named_parameters():
        assert param.requires_grad == (name in adapters or name in fusion), name
    clip_q = model.encoder.clip.layers[0].attn.q_proj
    assert isinstance(clip_q, LoRALinear) and not clip_q.weight.requires_grad
    assert isinstance(model.decoder.layers[3], FusionLayer)
    assert not isinstance(model.decoder.layers[3].fusion_layer.attn.q_proj, LoRALinear)  # "full": no adapters
    with pytest.raises(ValueError, match="fusion_trainable must be one of"):
        lora_llama3_2_vision_11b(["q_proj"], fusion_trainable="partly")


# The published configs' dimensions (meta-llama/Llama-3.2-{11B,90B}-Vision-Instruct config.json).
_PUBLISHED_VISION = dict(
    hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_global_layers=8, attention_heads=16,
    image_size=560, patch_size=14, max_num_tiles=4, vision_output_dim=7680,
    intermediate_layers_indices=[3, 7, 15, 23, 30],
)  # fmt: skip
_PUBLISHED_TEXT = {
    "llama3_2_vision_11b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
        cross_attention_layers=[3, 8, 13, 18, 23, 28, 33, 38]),
    "llama3_2_vision_90b": dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=100, num_attention_heads=64,
        num_key_value_heads=8, cross_attention_layers=list(range(3, 100, 5))),
}  # fmt: skip


@pytest.mark.parametrize("builder", [llama3_2_vision_11b, llama3_2_vision_90b])
def test_released_sizes_have_transformers_parameter_count(builder):
    config = transformers.MllamaConfig(
        text_config=dict(vocab_size=128_256, **_PUBLISHED_TEXT[builder.__name__]), vision_config=_PUBLISHED_VISION
    )
    with torch.device("meta"):
        reference = transformers.MllamaForConditionalGeneration(config)
        model = builder()
    ours, theirs = (sum(p.numel() for p in m.parameters()) for m in (model, reference))
    print(f"{builder.__name__}: {ours:,} parameters")
    assert ours == theirs


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_from_hf_config_builds_the_lora_variant(models, use_dora):
    """LoRA arguments to the config.json reader (as ``tune.models.from_hf`` passes them) give the LoRA model: the
    base weights load, and with fresh adapters (DoRA magnitudes from the loaded weights) it computes the base
    model's logits; the parts train as asked."""
    from tune.modules.peft import initialize_dora_magnitudes

    _, model, hf_config = models
    lora = llama3_2_vision_from_hf_config(
        hf_config, lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, use_dora=use_dora
    ).eval()
    missing, unexpected = lora.load_state_dict(model.state_dict(), strict=False)
    adapters = get_adapter_params(lora)
    assert not unexpected and set(missing) == set(adapters)
    if use_dora:
        initialize_dora_magnitudes(lora)
    assert lora.trainable_parts == {"decoder": "frozen", "encoder": "lora", "fusion": "lora"}
    decoder_adapters = [name for name in adapters if name.startswith("decoder.")]
    assert any(name.startswith("encoder.") for name in adapters) and decoder_adapters
    assert all(".fusion_layer." in name for name in decoder_adapters)  # the decoder's own layers stay frozen
    torch.manual_seed(2)
    grids = [[(1, 2)]]
    tokens = torch.tensor([[IMAGE, *_text(6)]])
    ours, _ = _images(grids)
    _, encoder_mask = _cross_attention_mask(tokens, grids, 1)
    with torch.no_grad():
        expected = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
        actual = lora(tokens, encoder_input=ours, encoder_mask=encoder_mask)
    assert (expected - actual).abs().max().item() <= 1e-5
