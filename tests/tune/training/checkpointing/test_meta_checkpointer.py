import json

import pytest
import torch

from tests.tune.training.checkpointing.tiny_llama import FAMILY, HF_CONFIG, TinyLlama, make_hf_checkpoint
from tune.training.checkpointing import MODEL_KEY, FullModelMetaCheckpointer, permute_hf_to_meta, permute_meta_to_hf


def _to_meta_layout(weight, num_heads):
    # Written from the definitions, row by row: within a head, rotate_half pairs rows (i, i + d/2) and Meta's
    # interleaved RoPE pairs rows (2i, 2i + 1); so HF row h*d + j*d/2 + i holds Meta row h*d + 2i + j.
    head_dim = weight.shape[0] // num_heads
    meta = torch.empty_like(weight)
    for h in range(num_heads):
        for i in range(head_dim // 2):
            for j in range(2):
                meta[h * head_dim + 2 * i + j] = weight[h * head_dim + j * head_dim // 2 + i]
    return meta


def _write_meta_checkpoint(hf_model, directory):
    heads, kv_heads = HF_CONFIG["num_attention_heads"], HF_CONFIG["num_key_value_heads"]
    sd = hf_model.state_dict()
    meta = {
        "tok_embeddings.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
        "rope.freqs": torch.zeros(4),
    }
    for n in range(HF_CONFIG["num_hidden_layers"]):
        hf = f"model.layers.{n}."
        meta |= {
            f"layers.{n}.attention.wq.weight": _to_meta_layout(sd[hf + "self_attn.q_proj.weight"], heads),
            f"layers.{n}.attention.wk.weight": _to_meta_layout(sd[hf + "self_attn.k_proj.weight"], kv_heads),
            f"layers.{n}.attention.wv.weight": sd[hf + "self_attn.v_proj.weight"],
            f"layers.{n}.attention.wo.weight": sd[hf + "self_attn.o_proj.weight"],
            f"layers.{n}.feed_forward.w1.weight": sd[hf + "mlp.gate_proj.weight"],
            f"layers.{n}.feed_forward.w2.weight": sd[hf + "mlp.down_proj.weight"],
            f"layers.{n}.feed_forward.w3.weight": sd[hf + "mlp.up_proj.weight"],
            f"layers.{n}.attention_norm.weight": sd[hf + "input_layernorm.weight"],
            f"layers.{n}.ffn_norm.weight": sd[hf + "post_attention_layernorm.weight"],
        }
    directory.mkdir()
    torch.save({k: v.clone() for k, v in meta.items()}, directory / "consolidated.00.pth")
    params = {"dim": 32, "n_heads": heads, "n_kv_heads": kv_heads, "n_layers": 2, "norm_eps": 1e-5, "vocab_size": 64}
    (directory / "params.json").write_text(json.dumps(params))
    (directory / "tokenizer.model").write_bytes(b"\x00tokenizer")
    return meta


def test_permutations_are_inverse_and_match_the_row_definition():
    weight = torch.randn(4 * 8, 32)
    assert torch.equal(permute_hf_to_meta(weight, 4), _to_meta_layout(weight, 4))
    assert torch.equal(permute_meta_to_hf(permute_hf_to_meta(weight, 4), 4), weight)


def test_meta_checkpoint_gives_transformers_logits_and_round_trips(tmp_path):
    hf_model = make_hf_checkpoint(tmp_path / "hf")
    meta = _write_meta_checkpoint(hf_model, tmp_path / "meta")
    ckpt = FullModelMetaCheckpointer(tmp_path / "meta", model_type=FAMILY, output_dir=tmp_path / "out")
    state = ckpt.load_checkpoint()[MODEL_KEY]
    model = TinyLlama().eval()
    model.load_state_dict(state)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(tokens).logits, rtol=1e-5, atol=1e-5)
    out = ckpt.save_checkpoint({MODEL_KEY: state}, epoch=0)
    saved = torch.load(out / "consolidated.00.pth", weights_only=True)
    assert saved.keys() == meta.keys() - {"rope.freqs"}
    assert all(torch.equal(saved[k], meta[k]) for k in saved)
    assert (out / "params.json").is_file() and (out / "tokenizer.model").read_bytes() == b"\x00tokenizer"


def test_meta_without_params_json_is_refused(tmp_path):
    _write_meta_checkpoint(make_hf_checkpoint(tmp_path / "hf"), tmp_path / "meta")
    (tmp_path / "meta" / "params.json").unlink()
    with pytest.raises(ValueError, match="params.json"):
        FullModelMetaCheckpointer(tmp_path / "meta", model_type=FAMILY, output_dir=tmp_path / "out")
