"""generate() with images, for each vision-language family: greedy tokens with a KV cache equal those recomputed
without one, and equal transformers' greedy ``generate`` (``do_sample=False``) on the same image prompt.

The models are tiny random transformers models (the sizes of tests/tune/models/test_<family>.py), converted with
the family's ``hf_to_tune``. Llama 3.2 Vision's prompts start with the image token, and its reference lists the
vision encoder's intermediate layers one lower: the two places where transformers 5.23 deviates from Meta's model
(see tests/tune/models/test_llama3_2_vision.py).
"""

import pytest
import torch

from tune.generation import generate

transformers = pytest.importorskip("transformers")

NUM_NEW = 8
TOLERANCE = 1e-4


def _spread(hf_model, norm_offset, scale=0.15):
    """Random weights everywhere (the initialisation leaves norms, gates and biases trivial), seeded."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "norm" in name or "ln_q" in name:
                param.copy_(norm_offset(name) + 0.2 * torch.randn_like(param))
            elif "gate" in name:
                param.copy_(torch.randn_like(param))
            else:
                param.normal_(0.0, 0.3 if "embed" in name else scale)
    return hf_model.eval()


def _hf_greedy(hf_model, input_ids, **kwargs):
    """transformers' greedy tokens after ``input_ids`` [b, NUM_NEW] and the raw logits they came from."""
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=input_ids, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, do_sample=False,
            return_dict_in_generate=True, output_logits=True, **kwargs,
        )  # fmt: skip
    return out.sequences[:, input_ids.shape[1] :], torch.stack(out.logits, dim=1)


def _tune_generate(model, prompt, *, use_cache, **kwargs):
    tokens, logits = generate(
        model, prompt, max_generated_tokens=NUM_NEW, temperature=0.0, use_cache=use_cache, **kwargs
    )
    return tokens[:, prompt.shape[1] :], logits


def _check_cache_and_reference(model, prompt, reference, **kwargs):
    """Greedy tokens and logits with a KV cache, without one, and transformers' (``reference``) all agree."""
    expected, expected_logits = reference
    cached, cached_logits = _tune_generate(model, prompt, use_cache=True, **kwargs)
    full, full_logits = _tune_generate(model, prompt, use_cache=False, **kwargs)
    assert expected_logits.abs().max() > 1.0  # not a comparison of near-zero logits
    cache_error = (cached_logits - full_logits).abs().max().item()
    hf_error = (cached_logits - expected_logits).abs().max().item()
    print(f"{type(model).__name__}: max abs logit error, cached vs recomputed {cache_error:.2e}, vs transformers "
          f"{hf_error:.2e}; tokens {expected.tolist()}")  # fmt: skip
    assert torch.equal(cached, full) and torch.equal(cached, expected)
    assert cache_error <= TOLERANCE and hf_error <= TOLERANCE
    assert not model.caches_are_setup()  # generate removes the caches it set up


# ---- Qwen2.5-VL ---------------------------------------------------------------------------------------------------

QWEN_VOCAB, QWEN_START, QWEN_END, QWEN_IMAGE, QWEN_PAD = 128, 125, 126, 127, 0
QWEN_TEXT = dict(
    vocab_size=QWEN_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=10_000.0, mrope_section=[1, 1, 2]),
)  # fmt: skip
QWEN_VISION = dict(
    depth=3, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=2, temporal_patch_size=2,
    spatial_merge_size=2, window_size=8, out_hidden_size=32, fullatt_block_indexes=[1],
)  # fmt: skip


@pytest.fixture(scope="module")
def qwen():
    from tune.models.qwen2_5_vl import qwen2_5_vl_from_hf_config, qwen2_5_vl_hf_to_tune

    config = transformers.Qwen2_5_VLConfig(
        text_config=QWEN_TEXT, vision_config=QWEN_VISION, image_token_id=QWEN_IMAGE,
        vision_start_token_id=QWEN_START, vision_end_token_id=QWEN_END,
    )  # fmt: skip
    hf_model = _spread(transformers.Qwen2_5_VLForConditionalGeneration(config).float(), lambda _: 1.0)
    hf_config = config.to_dict()
    model = qwen2_5_vl_from_hf_config(hf_config).eval()
    model.load_state_dict(qwen2_5_vl_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model


def _qwen_row(text_before, grid, text_after):
    image = [QWEN_START, *[QWEN_IMAGE] * (grid[0] * grid[1] * grid[2] // 4), QWEN_END] if grid else []
    return torch.randint(1, 120, (text_before,)).tolist() + image + torch.randint(1, 120, (text_after,)).tolist()


def _qwen_images(grids):
    grid_thw = torch.tensor(grids)
    return {"pixel_values": torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 2 * 2), "image_grid_thw": grid_thw}


def test_qwen2_5_vl_one_image(qwen):
    hf_model, model = qwen
    torch.manual_seed(1)
    # a 4 x 6 merged grid: the text after it is shifted by 6 - 24 positions, in the prompt and while decoding
    prompt = torch.tensor([_qwen_row(3, (1, 8, 12), 4)])
    images = _qwen_images([(1, 8, 12)])
    reference = _hf_greedy(
        hf_model, prompt, attention_mask=torch.ones_like(prompt), mm_token_type_ids=(prompt == QWEN_IMAGE).int(),
        **images,
    )  # fmt: skip
    _check_cache_and_reference(model, prompt, reference, pad_id=QWEN_PAD, encoder_input=images)


def test_qwen2_5_vl_left_padded_batch_with_a_text_only_row(qwen):
    hf_model, model = qwen
    torch.manual_seed(2)
    rows = [_qwen_row(2, (1, 4, 8), 3), _qwen_row(5, None, 0), _qwen_row(1, (1, 6, 4), 1)]
    seq_len = max(map(len, rows))
    prompt = torch.tensor([[QWEN_PAD] * (seq_len - len(row)) + row for row in rows])
    real = torch.tensor([[False] * (seq_len - len(row)) + [True] * len(row) for row in rows])
    images = _qwen_images([(1, 4, 8), (1, 6, 4)])
    reference = _hf_greedy(
        hf_model, prompt, attention_mask=real.long(), mm_token_type_ids=(prompt == QWEN_IMAGE).int(), **images
    )
    _check_cache_and_reference(model, prompt, reference, pad_id=QWEN_PAD, encoder_input=images)


# ---- Gemma 3 ------------------------------------------------------------------------------------------------------

GEMMA_VOCAB, GEMMA_BOI, GEMMA_EOI, GEMMA_IMAGE, GEMMA_PAD, GEMMA_BOS = 100, 97, 98, 99, 0, 2
GEMMA_TEXT = dict(
    vocab_size=GEMMA_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=3, sliding_window_pattern=3,
    query_pre_attn_scalar=8,
)  # fmt: skip
GEMMA_VISION = dict(
    hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
    vision_use_head=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def gemma():
    from tune.models.gemma3_vision import gemma3_vision_from_hf_config, gemma3_vision_hf_to_tune

    config = transformers.Gemma3Config(
        text_config=GEMMA_TEXT, vision_config=GEMMA_VISION, mm_tokens_per_image=4, boi_token_index=GEMMA_BOI,
        eoi_token_index=GEMMA_EOI, image_token_index=GEMMA_IMAGE,
    )  # fmt: skip
    hf_model = transformers.Gemma3ForConditionalGeneration(config).float()
    _spread(hf_model, lambda name: 1.0 if "vision_tower" in name else 0.0)
    hf_config = config.to_dict()
    model = gemma3_vision_from_hf_config(hf_config).eval()
    model.load_state_dict(gemma3_vision_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model


def _gemma_row(*parts):
    ids = [GEMMA_BOS]
    for part in parts:
        if part == "image":
            ids += [GEMMA_BOI, *[GEMMA_IMAGE] * 4, GEMMA_EOI]
        else:
            ids += torch.randint(3, 90, (part,)).tolist()
    return ids


@pytest.mark.parametrize("num_images", [1, 2])
def test_gemma3_vision(gemma, num_images):
    hf_model, model = gemma
    torch.manual_seed(3)
    parts = [3, "image", 2] + (["image", 1] if num_images == 2 else [])
    prompt = torch.tensor([_gemma_row(*parts)])
    pixel_values = torch.randn(num_images, 3, 32, 32)
    reference = _hf_greedy(
        hf_model, prompt, attention_mask=torch.ones_like(prompt), token_type_ids=(prompt == GEMMA_IMAGE).long(),
        pixel_values=pixel_values,
    )  # fmt: skip
    _check_cache_and_reference(model, prompt, reference, pad_id=GEMMA_PAD, encoder_input={"images": pixel_values})


# ---- Llama 3.2 Vision ---------------------------------------------------------------------------------------------

LLAMA_VOCAB, LLAMA_IMAGE = 64, 64
TILE, PATCH, MAX_TILES = 28, 14, 4
LLAMA_TEXT = dict(
    vocab_size=LLAMA_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=7, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, cross_attention_layers=[1, 4], pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
    rope_parameters=dict(rope_type="llama3", rope_theta=500_000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=8192),
)  # fmt: skip
LLAMA_VISION = dict(
    hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_global_layers=2, attention_heads=2,
    image_size=TILE, patch_size=PATCH, max_num_tiles=MAX_TILES, vision_output_dim=48,
)  # fmt: skip


@pytest.fixture(scope="module")
def llama():
    from tune.models.llama3_2_vision import llama3_2_vision_from_hf_config, llama3_2_vision_hf_to_tune

    hf_config = transformers.MllamaConfig(
        text_config=LLAMA_TEXT, vision_config={**LLAMA_VISION, "intermediate_layers_indices": [1, 2]},
        image_token_index=LLAMA_IMAGE,
    ).to_dict()  # fmt: skip
    # transformers 5.23 concatenates the outputs of the listed layers, Meta's model (and tune) their inputs
    reference = transformers.MllamaConfig(
        text_config=LLAMA_TEXT, vision_config={**LLAMA_VISION, "intermediate_layers_indices": [0, 1]},
        image_token_index=LLAMA_IMAGE,
    )  # fmt: skip
    hf_model = transformers.MllamaForConditionalGeneration(reference).float()
    _spread(hf_model, lambda name: 1.0 if name.endswith("weight") else 0.0, scale=0.2)
    model = llama3_2_vision_from_hf_config(hf_config).eval()
    model.load_state_dict(llama3_2_vision_hf_to_tune(hf_model.state_dict(), hf_config), strict=True)
    return hf_model, model


def test_llama3_2_vision_left_padded_batch(llama):
    hf_model, model = llama
    torch.manual_seed(4)
    grids = [(1, 3), (2, 2)]
    rows = [[LLAMA_IMAGE, *torch.randint(3, LLAMA_VOCAB, (9,)).tolist()]]
    rows.append([LLAMA_IMAGE, *torch.randint(3, LLAMA_VOCAB, (5,)).tolist()])
    seq_len = max(map(len, rows))
    prompt = torch.tensor([[0] * (seq_len - len(row)) + row for row in rows])
    real = prompt != 0
    ratios = [(h, w) for h in range(1, MAX_TILES + 1) for w in range(1, MAX_TILES + 1) if h * w <= MAX_TILES]
    images = torch.zeros(2, 1, MAX_TILES, 3, TILE, TILE)
    aspect_ratio_mask = torch.zeros(2, 1, MAX_TILES, dtype=torch.long)
    cross_attention_mask = torch.zeros(2, seq_len, 1, MAX_TILES, dtype=torch.long)
    for row, (h, w) in enumerate(grids):
        images[row, 0, : h * w] = torch.randn(h * w, 3, TILE, TILE)
        aspect_ratio_mask[row, 0, : h * w] = 1
        start = int((prompt[row] == LLAMA_IMAGE).nonzero()[0])
        cross_attention_mask[row, start:, 0, : h * w] = 1
    reference = _hf_greedy(
        hf_model, prompt, attention_mask=real.long(), pixel_values=images,
        aspect_ratio_ids=torch.tensor([[ratios.index(g) + 1] for g in grids]), aspect_ratio_mask=aspect_ratio_mask,
        cross_attention_mask=cross_attention_mask,
    )  # fmt: skip
    tokens_per_tile = (TILE // PATCH) ** 2 + 1
    encoder_mask = cross_attention_mask.bool().repeat_interleave(tokens_per_tile, dim=3).reshape(2, seq_len, -1)
    encoder_input = {"images": images, "aspect_ratio": torch.tensor([[list(g)] for g in grids])}
    _check_cache_and_reference(
        model, prompt, reference, pad_id=0, encoder_input=encoder_input, encoder_mask=encoder_mask
    )
