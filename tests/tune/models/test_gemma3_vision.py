"""Gemma 3 with images (tune.models.gemma3's vision-language model) against transformers'
``Gemma3ForConditionalGeneration``: logits with one image, a padded batch mixing image and text-only rows, two
images in a row; the exact weight round trip; and text-only input against tune's text model."""

import pytest
import torch

from tune.models.gemma3 import (
    gemma3_from_hf_config,
    gemma3_hf_to_tune,
    gemma3_vision_hf_to_tune,
    gemma3_vision_language_from_hf_config,
    gemma3_vision_tune_to_hf,
    image_attention_mask,
)

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
    model = gemma3_vision_language_from_hf_config(hf_config).eval()
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
        actual = model(tokens, pixel_values=pixel_values, mask=mask)
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
        model(torch.tensor([_row(2, "image")]), pixel_values=torch.randn(2, 3, 32, 32))
