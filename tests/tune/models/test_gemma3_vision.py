"""Gemma 3 with images (tune.models.gemma3_vision) against transformers' ``Gemma3ForConditionalGeneration``:
logits with one image, a padded batch mixing image and text-only rows, two images in a row, loading through
``tune.models.from_hf``; the exact weight round trip; text-only input against tune's text model; KV-cache
generation against the whole sequence; the released sizes' parameter counts; which parts train."""

import pytest
import torch

from tune.models import from_hf
from tune.models.gemma3 import gemma3_from_hf_config, gemma3_hf_to_tune
from tune.models.gemma3_vision import (
    Gemma3VisionLanguageModel,
    gemma3_vision,
    gemma3_vision_from_hf_config,
    gemma3_vision_hf_to_tune,
    gemma3_vision_tune_to_hf,
    image_attention_mask,
    lora_gemma3_vision,
)
from tune.modules.peft import get_adapter_params
from tune.registry import family_for_hf_model_type, get_model_family

transformers = pytest.importorskip("transformers")

VOCAB, BOI, EOI, IMAGE, PAD, BOS = 100, 97, 98, 99, 0, 2
TOKENS_PER_IMAGE = 4
# three layers: two local (window 3, shorter than an image's 4 tokens) and one global
TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=3, sliding_window_pattern=3,
    query_pre_attn_scalar=8,
)  # fmt: skip
# 32 x 32 images in 8 x 8 patches: a 4 x 4 grid, pooled 2 x 2 into 4 image tokens
VISION = dict(
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
    vision_use_head=False,  # as in the released configs: the pooling head is unused by Gemma 3
)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def models():
    config = transformers.Gemma3Config(
        text_config=TEXT, vision_config=VISION, mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=BOI,
        eoi_token_index=EOI, image_token_index=IMAGE,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    assert hf_model.config.text_config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    with torch.no_grad():  # random weights everywhere: the initialisation leaves norms and the projection trivial
        for name, param in hf_model.named_parameters():
            if "norm" in name:
                param.copy_(0.2 * torch.randn_like(param) + (1.0 if "vision_tower" in name else 0.0))
            else:
                param.normal_(0.0, 0.3 if "embed" in name else 0.15)
    hf_config = config.to_dict()
    model = gemma3_vision_from_hf_config(hf_config).eval()
    model.load_state_dict(gemma3_vision_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model, hf_config


def _row(*parts):
    """Token ids from text lengths (ints, random text tokens) and the string "image" (BOI, image tokens, EOI)."""
    ids = [BOS]
    for part in parts:
        ids += [BOI, *[IMAGE] * TOKENS_PER_IMAGE, EOI] if part == "image" else torch.randint(3, 90, (part,)).tolist()
    return ids


def _batch(rows):
    """Right-padded tokens [b, s] and attention mask [b, s] of rows of different lengths."""
    seq_len = max(len(row) for row in rows)
    tokens = torch.full((len(rows), seq_len), PAD)
    attention_mask = torch.zeros(len(rows), seq_len, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    return tokens, attention_mask


def _max_error(hf_model, model, rows, num_images):
    torch.manual_seed(1)
    tokens, attention_mask = _batch(rows)
    pixel_values = torch.randn(num_images, 3, 32, 32)
    token_type_ids = (tokens == IMAGE).long()  # the processor's: what makes an image attend to itself both ways
    seq_len = tokens.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    mask = causal[None] & attention_mask.bool()[:, None, :]
    with torch.no_grad():
        expected = hf_model(
            input_ids=tokens, pixel_values=pixel_values, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits
        actual = model(tokens, mask=mask, encoder_input={"images": pixel_values})
    real = attention_mask.bool()
    assert expected[real].abs().max() > 1.0  # not a comparison of near-zero logits
    return (expected[real] - actual[real]).abs().max().item()


def test_one_image(models):
    hf_model, model, _ = models
    torch.manual_seed(2)
    error = _max_error(hf_model, model, [_row(3, "image", 5)], num_images=1)
    print(f"gemma3 vision, one image: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_padded_batch_with_images_at_different_positions_and_a_text_only_row(models):
    hf_model, model, _ = models
    torch.manual_seed(3)
    rows = [_row(1, "image", 6), _row(7, "image", 2), _row(9)]
    error = _max_error(hf_model, model, rows, num_images=2)
    print(f"gemma3 vision, padded batch: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_two_images_in_one_row(models):
    hf_model, model, _ = models
    torch.manual_seed(4)
    error = _max_error(hf_model, model, [_row(2, "image", 3, "image", 4)], num_images=2)
    print(f"gemma3 vision, two images in a row: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_weight_round_trip_is_exact(models):
    hf_model, model, hf_config = models
    state = model.state_dict()
    back = gemma3_vision_tune_to_hf(state, hf_config)
    # the files' layout of transformers' own state dict (lm_head is tied and not written)
    renames = {
        "model.language_model.": "language_model.model.",
        "model.vision_tower.": "vision_tower.vision_model.",
        "model.multi_modal_projector.": "multi_modal_projector.",
    }
    expected = {}
    for key, value in hf_model.state_dict().items():
        if key == "lm_head.weight":
            continue
        prefix = next(p for p in renames if key.startswith(p))
        expected[renames[prefix] + key.removeprefix(prefix)] = value
    assert back.keys() == expected.keys()
    assert all(torch.equal(back[key], expected[key]) for key in expected)
    again = gemma3_vision_hf_to_tune(back, hf_config)
    assert again.keys() == state.keys()
    assert all(torch.equal(again[key], state[key]) for key in state)


def test_text_only_input_matches_the_text_model(models):
    hf_model, model, hf_config = models
    text_model = gemma3_from_hf_config(hf_config).eval()
    text_model.load_state_dict(gemma3_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    tokens = torch.tensor([_row(12), _row(12)])
    with torch.no_grad():
        assert torch.equal(model(tokens), text_model(tokens))


def test_image_mask_is_causal_plus_each_image_both_ways():
    is_image = torch.tensor([[False, True, True, False, True, True]])
    mask = image_attention_mask(is_image)[0]
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    extra = mask & ~causal
    assert extra.nonzero().tolist() == [[1, 2], [4, 5]]  # within an image only, never across images or text


def test_image_tokens_must_match_the_images(models):
    _, model, _ = models
    with pytest.raises(ValueError, match="image tokens"):
        model(torch.tensor([_row(2, "image")]), encoder_input={"images": torch.randn(2, 3, 32, 32)})


def test_image_tokens_without_images_are_an_error(models):
    _, model, _ = models
    with pytest.raises(ValueError, match="no images"):
        model(torch.tensor([_row(2, "image")]))
    with pytest.raises(ValueError, match="encoder_input"):
        model(torch.tensor([_row(2)]), encoder_input={"pixel_values": torch.randn(1, 3, 32, 32)})


def test_no_image_rows_and_an_empty_image_tensor_are_text_only(models):
    _, model, _ = models
    tokens = torch.tensor([_row(6)])
    with torch.no_grad():
        expected = model(tokens)
        assert torch.equal(model(tokens, encoder_input={"images": torch.zeros(0, 3, 32, 32)}), expected)
        assert torch.equal(model(tokens, encoder_input=None, encoder_mask=object()), expected)


def test_from_hf_loads_the_multimodal_checkpoint_whole(models, tmp_path):
    hf_model, model, _ = models
    assert family_for_hf_model_type("gemma3").name == "gemma3_vision"
    assert family_for_hf_model_type("gemma3_text").name == "gemma3"
    hf_model.save_pretrained(tmp_path)  # the files' keys: language_model.model.*, vision_tower.vision_model.*
    loaded = from_hf(tmp_path, dtype=torch.float32)
    assert isinstance(loaded, Gemma3VisionLanguageModel)
    torch.manual_seed(5)
    error = _max_error(hf_model, loaded, [_row(3, "image", 4), _row(9)], num_images=1)
    print(f"gemma3 vision via from_hf: max abs logit error {error:.3e}")
    assert error <= TOLERANCE


def test_kv_cache_generation_matches_the_whole_sequence(models):
    """Prefill with the image, then one token at a time: the logits of each step equal the whole sequence's."""
    _, model, _ = models
    torch.manual_seed(6)
    sequence = torch.tensor([_row(2, "image", 3) + torch.randint(3, 90, (5,)).tolist()])
    prompt_len = sequence.shape[1] - 5
    images = {"images": torch.randn(1, 3, 32, 32)}
    with torch.no_grad():
        expected = model(sequence, encoder_input=images)
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=sequence.shape[1])
        try:
            assert model.caches_are_setup() and model.caches_are_enabled()
            steps = [model(sequence[:, :prompt_len], encoder_input=images)]
            steps += [model(sequence[:, i : i + 1]) for i in range(prompt_len, sequence.shape[1])]
            model.reset_caches()
        finally:
            model.delete_caches()
    actual = torch.cat(steps, dim=1)
    error = (expected - actual).abs().max().item()
    print(f"gemma3 vision KV-cache generation vs whole sequence: max abs logit error {error:.3e}")
    assert error <= 1e-5
    assert not model.caches_are_setup()


def test_a_generated_image_token_decodes_as_a_token(models):
    """A model may generate its image token; after the prompt it is embedded as a token (as transformers does),
    not refused for want of an image: the step's logits equal the text model's for that token."""
    _, model, _ = models
    torch.manual_seed(7)
    prompt = torch.tensor([_row(2, "image", 3)])
    images = {"images": torch.randn(1, 3, 32, 32)}
    with torch.no_grad():
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=prompt.shape[1] + 2)
        try:
            model(prompt, encoder_input=images)
            generated = model(torch.tensor([[IMAGE]]))
            model.reset_caches()
            model(prompt, encoder_input=images)
            expected = model.decoder(torch.tensor([[IMAGE]]))  # the token's own embedding, after the same cache
        finally:
            model.delete_caches()
    assert torch.equal(generated, expected)
    with pytest.raises(ValueError, match="no images"):  # in a prompt, an image token without its image is an error
        model(torch.tensor([_row(2, "image")]))


def test_model_delegates_the_decoder_settings(models):
    _, model, _ = models
    assert model.tok_embeddings is model.decoder.tok_embeddings and model.output is model.decoder.output
    tokens = torch.tensor([_row(4)])
    try:
        model.skip_output_layer = True
        assert model.decoder.skip_output_layer
        with torch.no_grad():
            assert model(tokens).shape == (1, tokens.shape[1], 32)
    finally:
        model.skip_output_layer = False
    try:
        model.set_num_output_chunks(2)
        with torch.no_grad():
            assert len(model(tokens)) == 2
    finally:
        model.set_num_output_chunks(0)


@pytest.mark.gpu
def test_training_step_with_images_does_not_wait_for_the_device(models):
    """Forward and backward of a batch with images on the GPU raise nothing under CUDA's sync debug mode "error"
    (no ``.item()``, no ``int(tensor)``: the image-token count is checked on the CPU only), and give the CPU's
    logits. (TUNE_GPU_TIER_DEVICE=cpu dry-runs it on the CPU, without the sync check.)"""
    import copy
    import os

    _, model, _ = models
    device = torch.device(os.environ.get("TUNE_GPU_TIER_DEVICE", "cuda"))
    torch.manual_seed(7)
    tokens = torch.tensor([_row(2, "image", 3, "image", 1)])
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(tokens, encoder_input={"images": images})
    on_device = copy.deepcopy(model).to(device).train()
    tokens, images = tokens.to(device), images.to(device)
    assert not on_device.check_image_tokens
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        logits = on_device(tokens, encoder_input={"images": images})
        logits.float().square().mean().backward()
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert (logits.detach().cpu() - expected).abs().max().item() <= 1e-3
    assert on_device.projector.projection.grad is not None


# Published configs (transcribed from each repo's config.json; no network in the tests): the language model's
# shape (the rest at Gemma3TextConfig's defaults, as in the files) and the shared SigLIP.
PUBLISHED_TEXT = {
    "gemma3_vision_4b": dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                             num_key_value_heads=4, head_dim=256),
    "gemma3_vision_12b": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                              num_key_value_heads=8, head_dim=256),
    "gemma3_vision_27b": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                              num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168),
}  # fmt: skip
PUBLISHED_VISION = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, image_size=896,
    patch_size=14, vision_use_head=False,
)  # fmt: skip


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight once


@pytest.mark.parametrize("name", sorted(PUBLISHED_TEXT))
def test_named_size_has_transformers_parameter_count(name):
    config = transformers.Gemma3Config(
        text_config=PUBLISHED_TEXT[name], vision_config=PUBLISHED_VISION, mm_tokens_per_image=256
    )
    family = get_model_family("gemma3_vision")
    with torch.device("meta"):
        reference = transformers.Gemma3ForConditionalGeneration(config)
        ours = family.builders[name]()
    print(f"{name}: {_count(ours):,} parameters")
    assert _count(ours) == _count(reference)
    assert family.sizes[name].repo == f"google/gemma-3-{name.rsplit('_', 1)[1]}-it"


def _tiny_dims():
    return dict(
        vocab_size=VOCAB, num_layers=2, num_heads=4, head_dim=8, num_kv_heads=2, embed_dim=32, intermediate_dim=48,
        max_seq_len=64, sliding_window_size=3, sliding_window_pattern=2, image_size=32, patch_size=8,
        vision_embed_dim=16, vision_num_layers=1, vision_num_heads=2, vision_intermediate_dim=24,
        mm_tokens_per_image=TOKENS_PER_IMAGE, image_token_id=IMAGE,
    )  # fmt: skip


def _trainable_parts(model) -> dict[str, set[bool]]:
    return {
        part: {p.requires_grad for p in getattr(model, part).parameters()}
        for part in ("decoder", "encoder", "projector")
    }


def test_full_builder_freezes_the_parts_that_do_not_train():
    model = gemma3_vision(**_tiny_dims())  # defaults: the language model and projector train, SigLIP is frozen
    assert _trainable_parts(model) == {"decoder": {True}, "encoder": {False}, "projector": {True}}
    model = gemma3_vision(**_tiny_dims(), decoder_trainable=False, encoder_trainable=True, fusion_trainable=False)
    assert _trainable_parts(model) == {"decoder": {False}, "encoder": {True}, "projector": {False}}


def test_lora_builder_puts_adapters_where_asked_and_trains_only_them():
    model = lora_gemma3_vision(["q_proj", "v_proj"], **_tiny_dims(), lora_rank=2)
    adapters = get_adapter_params(model)
    assert adapters and all(name.startswith("decoder.") for name in adapters)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(adapters)
    model = lora_gemma3_vision(
        ["q_proj"], decoder_trainable="frozen", encoder_trainable="LoRA", fusion_trainable="full",
        apply_lora_to_mlp=True, **_tiny_dims(), lora_rank=2,
    )  # fmt: skip
    adapters = set(get_adapter_params(model))
    assert {name.split(".lora_")[0] for name in adapters} == {
        "encoder.layers.0.attn.q_proj", "encoder.layers.0.mlp.fc1", "encoder.layers.0.mlp.fc2"
    }  # fmt: skip
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == adapters | {name for name, _ in model.named_parameters() if name.startswith("projector.")}
    # a LoRA vision encoder converts to transformers' module names (what a PEFT adapter is named after)
    hf_names = gemma3_vision_tune_to_hf({"encoder.layers.0.attn.q_proj.weight": torch.zeros(1)}, {})
    assert list(hf_names) == ["vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight"]


def test_lora_builder_rejects_what_cannot_be_built():
    with pytest.raises(ValueError, match="fusion_trainable='lora'"):
        lora_gemma3_vision(["q_proj"], fusion_trainable="lora", **_tiny_dims())
    with pytest.raises(ValueError, match="encoder_trainable must be one of"):
        lora_gemma3_vision(["q_proj"], encoder_trainable="partial", **_tiny_dims())
    with pytest.raises(ValueError, match="apply_lora_to_output"):
        lora_gemma3_vision(["q_proj"], apply_lora_to_output=True, **_tiny_dims())


def test_from_hf_config_takes_lora_and_trainable_arguments(models):
    _, _, hf_config = models
    model = gemma3_vision_from_hf_config(hf_config, lora_attn_modules=["q_proj"], encoder_trainable="lora")
    assert {name.split(".")[0] for name in get_adapter_params(model)} == {"decoder", "encoder"}
    with pytest.raises(ValueError, match="model_type 'gemma3'"):
        gemma3_vision_from_hf_config({**hf_config, "model_type": "gemma3_text"})


def test_dora_variant_from_config_computes_the_base_model(models):
    """use_dora through the config.json reader: with magnitudes from the loaded weights and fresh adapters, DoRA on
    the language model and the vision encoder computes the base model's logits."""
    from tune.modules.peft import get_adapter_params, initialize_dora_magnitudes

    _, model, hf_config = models
    dora = gemma3_vision_from_hf_config(
        hf_config, lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, use_dora=True,
        decoder_trainable="lora", encoder_trainable="lora",
    ).eval()  # fmt: skip
    missing, unexpected = dora.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) == set(get_adapter_params(dora))
    assert any(name.startswith("encoder.") and name.endswith("magnitude") for name in missing)
    initialize_dora_magnitudes(dora)
    torch.manual_seed(1)
    tokens, _ = _batch([_row(2, "image", 3)])
    images = {"images": torch.randn(1, 3, 32, 32)}
    with torch.no_grad():
        assert (model(tokens, encoder_input=images) - dora(tokens, encoder_input=images)).abs().max() <= 1e-5
