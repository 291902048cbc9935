"""Gemma 3 (tune.models.gemma3) against transformers: the older config.json layout, packed documents under sliding
windows, multimodal checkpoints (both key layouts, written back through the checkpointer) and bad configs.

Padded-batch logits and the exact round trip of a text checkpoint run with every family in test_hf.py (case
``gemma3`` of _hf_cases.py: 7 layers, so layer 5 is global, window 5 on 12 tokens, linearly scaled global RoPE).
"""

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.tune.models._hf_cases import VOCAB, build_hf_model, gemma3_config, padded_batch
from tune.models import from_hf
from tune.models.gemma3 import gemma3, gemma3_from_hf_config, gemma3_hf_to_tune
from tune.modules import LinearScaledRoPE, create_block_causal_mask, get_causal_mask_from_padding_mask

transformers = pytest.importorskip("transformers")

# the tiny language model of the multimodal case: gemma3_config's dimensions
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=60,
    intermediate_size=94,
    num_hidden_layers=7,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=14,
    max_position_embeddings=64,
    sliding_window=5,
    query_pre_attn_scalar=20,
)


def _padded_logits(hf_model, model):
    """transformers' and tune's logits at the real tokens of a left-padded batch."""
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask, position_ids=positions).logits
        actual = model(tokens, mask=get_causal_mask_from_padding_mask(attention_mask.bool()), input_pos=positions)
    real = attention_mask.bool()
    assert expected.abs().max() > 1.0  # not a comparison of near-zero logits
    return (expected[real] - actual[real]).abs().max().item()


def test_older_config_layout_gives_transformers_logits(tmp_path):
    # transformers 4's keys: rope_theta / rope_local_base_freq / rope_scaling and sliding_window_pattern, no
    # layer_types and no rope_parameters; transformers 5 reads them into the same model
    old = dict(
        TEXT,
        model_type="gemma3_text",
        rope_theta=5_000.0,
        rope_local_base_freq=50.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
        sliding_window_pattern=6,
        rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh",
    )
    hf_model = build_hf_model(transformers.Gemma3TextConfig(**{k: v for k, v in old.items() if k != "model_type"}))
    assert hf_model.config.layer_types[5] == "full_attention"
    assert hf_model.config.rope_parameters["full_attention"]["factor"] == 4.0
    hf_model.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(old))  # the older layout, as a transformers 4 export has it
    model = from_hf(tmp_path, dtype=torch.float32)
    error = _padded_logits(hf_model, model)
    print(f"gemma3 older config layout: max abs logit error {error:.3e}")
    assert error < 1e-5
    windows = [layer.attn.sliding_window for layer in model.layers]
    assert windows == [5, 5, 5, 5, 5, None, 5]
    rope = model.layers[5].attn.pos_embeddings
    assert isinstance(rope, LinearScaledRoPE) and (rope.base, rope.scale_factor) == (5_000.0, 4.0)
    assert {model.layers[i].attn.pos_embeddings.base for i in (0, 1, 2, 3, 4, 6)} == {50.0}


def test_both_config_layouts_build_the_same_model():
    new = gemma3_config().to_dict()
    old = {k: v for k, v in new.items() if k not in ("rope_parameters", "layer_types")}
    old.update(rope_theta=5_000.0, rope_local_base_freq=50.0, rope_scaling={"type": "linear", "factor": 4.0})
    layouts = []
    for config in (new, old):
        model = gemma3_from_hf_config(config)
        layouts.append([(layer.attn.sliding_window, repr(layer.attn.pos_embeddings)) for layer in model.layers])
    assert layouts[0] == layouts[1]
    assert layouts[0][5] == (None, "LinearScaledRoPE(dim=14, max_seq_len=64, base=5000.0, scale_factor=4.0)")


def test_packed_documents_equal_separate_runs():
    """Two documents longer than the window, packed in one row, give each document's own logits: the window and
    the block-causal document mask combine (local layers) and documents attend separately (global layer)."""
    torch.manual_seed(0)
    model = gemma3(
        vocab_size=VOCAB, num_layers=7, num_heads=4, head_dim=14, num_kv_heads=2, embed_dim=60, intermediate_dim=94,
        max_seq_len=64, rope_local_base=50.0, rope_base=5_000.0, rope_scale_factor=4.0, sliding_window_size=5,
        query_pre_attn_scalar=20,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.2 if "norm" in name or "embed" in name else 0.08)
    lengths = [20, 17]
    docs = [torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in lengths]
    packed = torch.cat(docs, dim=1)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        together = model(packed, mask=create_block_causal_mask([lengths]), input_pos=positions)
        apart = torch.cat([model(doc) for doc in docs], dim=1)
    error = (together - apart).abs().max().item()
    print(f"gemma3 packed vs separate: max abs logit error {error:.3e}")
    assert apart.abs().max() > 1.0
    assert error < 1e-5


def _multimodal_model(seed: int = 0):
    """A tiny Gemma3ForConditionalGeneration (a 1-layer SigLIP vision tower) with the text case's language model."""
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4,
        vision_use_head=False,  # as in the released configs (Gemma 3 uses no pooling head)
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=TEXT, vision_config=vision, mm_tokens_per_image=4, boi_token_index=97, eoi_token_index=98,
        image_token_index=99,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "language_model" in name and "norm" in name:
                param.copy_(0.2 * torch.randn_like(param))
            elif "language_model" in name:
                param.normal_(0.0, 0.2 if "embed" in name else 0.08)
    return model


@pytest.mark.parametrize("layout", ["hub", "module_tree"])
def test_multimodal_checkpoint_loads_its_language_model(tmp_path, layout):
    hf_model = _multimodal_model()
    hf_model.save_pretrained(
        tmp_path
    )  # the hub's keys: language_model.model.*, vision_tower.*, multi_modal_projector.*
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gemma3"
    if layout == "module_tree":  # transformers >= 4.52's own names: model.language_model.*, model.vision_tower.*
        state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
        assert any(k.startswith("model.language_model.") for k in state)
        save_file(state, str(tmp_path / "model.safetensors"))
    # from_hf loads a multimodal checkpoint whole (the gemma3_vision family, tests/tune/models/test_gemma3_vision.py);
    # its language model is this family's and gives the text logits
    model = from_hf(tmp_path, dtype=torch.float32)
    assert len(model.decoder.layers) == 7 and model.decoder.layers[5].attn.sliding_window is None
    error = _padded_logits(hf_model, model)
    print(f"gemma3 multimodal ({layout}): max abs logit error {error:.3e}")
    assert error < 1e-5


def test_multimodal_checkpoint_written_back_loads_in_transformers(tmp_path):
    from tune.training import FullModelHFCheckpointer

    hf_model = _multimodal_model()
    hf_model.save_pretrained(tmp_path / "hf")
    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=tmp_path / "hf", checkpoint_files=["model.safetensors"], model_type="gemma3",
        output_dir=tmp_path / "out",
    )  # fmt: skip
    state = checkpointer.load_checkpoint()["model"]
    assert not any("vision" in key or "projector" in key for key in state)
    model = gemma3_from_hf_config(json.loads((tmp_path / "hf" / "config.json").read_text()))
    model.load_state_dict(state)
    with torch.no_grad():
        model.layers[0].mlp.w1.weight.add_(0.05)  # a "fine-tuned" language model
    written = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    reloaded, info = transformers.Gemma3ForConditionalGeneration.from_pretrained(written, output_loading_info=True)
    # the language model is read in full; the vision tower and projector, which tune does not build, are carried
    # over from the input (ModelFamily.passthrough_hf_keys; tests/tune/training/checkpointing/test_passthrough.py)
    assert info["unexpected_keys"] == set() and info["missing_keys"] == set()
    vision = {k: v for k, v in hf_model.state_dict().items() if "vision_tower" in k or "multi_modal_projector" in k}
    assert vision and all(torch.equal(reloaded.state_dict()[key], value) for key, value in vision.items())
    error = _padded_logits(reloaded.eval(), model.eval())
    print(f"gemma3 multimodal written back: max abs logit error {error:.3e}")
    assert error < 1e-5


def test_unsupported_settings_are_named():
    config = gemma3_config().to_dict()
    config["rope_parameters"]["full_attention"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="RoPE scaling 'yarn'.*not supported"):
        gemma3_from_hf_config(config)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        gemma3_from_hf_config({**gemma3_config().to_dict(), "use_bidirectional_attention": True})
    with pytest.raises(ValueError, match="sliding_window_pattern must be at least 1"):
        gemma3(**{**_tiny_dims(), "sliding_window_pattern": 0})
    with pytest.raises(ValueError, match="no known mapping: vision_tower.x"):
        gemma3_hf_to_tune({"vision_tower.x": torch.zeros(1)}, {"model_type": "gemma3_text"})


def _tiny_dims():
    return dict(
        vocab_size=VOCAB, num_layers=2, num_heads=4, head_dim=14, num_kv_heads=2, embed_dim=60, intermediate_dim=94,
        max_seq_len=64,
    )  # fmt: skip
