"""generate(): KV cache vs recomputation, left padding, stop tokens, and parity with transformers' greedy generate."""

import pytest
import torch
from torch import nn

from tune.generation import generate, generate_next_token, left_pad
from tune.modules import (
    FeedForward,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
    disable_kv_cache,
)

VOCAB = 64
PROMPTS = [[5, 9, 3, 7, 1, 2], [11, 4, 8]]  # different lengths: the second row is left-padded by 3


def _tiny_decoder(max_seq_len: int = 48) -> TransformerDecoder:
    """A 2-layer GQA decoder built straight from tune.modules (no family code involved)."""
    torch.manual_seed(0)
    dim, num_heads, num_kv_heads, head_dim = 32, 4, 2, 8
    rope = RotaryPositionalEmbeddings(head_dim, max_seq_len)
    layers = []
    for _ in range(2):
        attn = MultiHeadAttention(
            embed_dim=dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=nn.Linear(dim, num_heads * head_dim, bias=False),
            k_proj=nn.Linear(dim, num_kv_heads * head_dim, bias=False),
            v_proj=nn.Linear(dim, num_kv_heads * head_dim, bias=False),
            output_proj=nn.Linear(num_heads * head_dim, dim, bias=False),
            pos_embeddings=rope,
            max_seq_len=max_seq_len,
        )
        mlp = FeedForward(
            gate_proj=nn.Linear(dim, 64, bias=False),
            down_proj=nn.Linear(64, dim, bias=False),
            up_proj=nn.Linear(dim, 64, bias=False),
        )
        layers.append(TransformerSelfAttentionLayer(attn, mlp, sa_norm=RMSNorm(dim), mlp_norm=RMSNorm(dim)))
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(VOCAB, dim),
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=RMSNorm(dim),
        output=nn.Linear(dim, VOCAB, bias=False),
    ).eval()


@pytest.fixture(scope="module")
def model() -> TransformerDecoder:
    return _tiny_decoder()


def test_cache_and_recompute_give_the_same_greedy_tokens(model):
    cached = generate(model, PROMPTS, max_generated_tokens=12, temperature=0.0)
    recomputed = generate(model, PROMPTS, max_generated_tokens=12, temperature=0.0, use_cache=False)
    assert cached.shape == (2, 12)
    assert torch.equal(cached, recomputed)
    assert not model.caches_are_enabled()  # caches set up by generate are removed again


def test_left_padded_rows_generate_what_they_would_alone(model):
    batched = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, torch.tensor(prompt), max_generated_tokens=10, temperature=0.0)
        assert torch.equal(batched[row], alone[0]), row


def test_logits_match_a_full_forward(model):
    tokens, logits = generate(model, PROMPTS, max_generated_tokens=6, temperature=0.0, return_logits=True)
    assert logits.shape == (2, 6, VOCAB)
    for row, prompt in enumerate(PROMPTS):
        sequence = torch.tensor([prompt + tokens[row].tolist()])
        with torch.no_grad():
            reference = model(sequence)[0, len(prompt) - 1 : -1]  # the logits that predicted each new token
        torch.testing.assert_close(logits[row], reference, rtol=0, atol=1e-5)


def test_tensor_prompt_with_leading_padding_equals_list_prompt(model):
    tokens, _ = left_pad(PROMPTS, pad_id=0)
    assert tokens.tolist() == [[5, 9, 3, 7, 1, 2], [0, 0, 0, 11, 4, 8]]
    from_list = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
    assert torch.equal(generate(model, tokens, max_generated_tokens=5, temperature=0.0), from_list)


def test_stop_tokens_end_rows_and_pad_them(model):
    free = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0)
    stop = int(free[0, 2])  # row 0 produces this token at step 2 (and maybe earlier); it ends row 0 there
    first = int((free[0] == stop).nonzero()[0])
    stopped = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0, stop_tokens=[stop], pad_id=0)
    assert torch.equal(stopped[0, : first + 1], free[0, : first + 1])
    assert (stopped[0, first + 1 :] == 0).all()
    row1_stops = (free[1] == stop).nonzero()
    end1 = int(row1_stops[0]) + 1 if len(row1_stops) else free.shape[1]
    assert torch.equal(stopped[1, :end1], free[1, :end1])
    # generation ends as soon as every row has stopped
    assert stopped.shape[1] == max(first + 1, end1)


def test_sampling_is_reproducible_and_cache_independent(model):
    kwargs = dict(max_generated_tokens=8, temperature=0.9, top_k=20, top_p=0.9)
    cached = generate(model, PROMPTS, rng=torch.Generator().manual_seed(3), **kwargs)
    recomputed = generate(model, PROMPTS, rng=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    assert torch.equal(cached, recomputed)


def test_caller_caches_are_reset_and_kept(model):
    model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=40)
    try:
        first = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
        second = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
        assert torch.equal(first, second)
        assert model.caches_are_enabled()
    finally:
        model.delete_caches()
    assert torch.equal(first, generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0, use_cache=False))


def test_errors(model):
    with pytest.raises(ValueError, match="max_seq_len 48"):
        generate(model, PROMPTS, max_generated_tokens=45)
    with pytest.raises(ValueError, match="all padding"):
        generate(model, torch.tensor([[0, 0], [1, 2]]), max_generated_tokens=2)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[1], []], max_generated_tokens=2)
    with pytest.raises(ValueError, match="max_generated_tokens"):
        generate(model, PROMPTS, max_generated_tokens=0)
    with pytest.raises(TypeError, match="use_cache=False"):
        generate(nn.Linear(2, 2), PROMPTS, max_generated_tokens=2)


# ---------------------------------------------------------------- parity with transformers' greedy generate


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """A tiny random LlamaForCausalLM saved to disk, and the tune model from_hf builds from the files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tune.models import from_hf

    config = LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.1,  # peakier logits than the default 0.02, so greedy choices are not near-ties
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    hf_model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    hf_model.save_pretrained(path)
    return hf_model, from_hf(path, dtype=torch.float32).eval()


def _hf_greedy(hf_model, prompts, max_new_tokens, eos_token_id=None):
    tokens, mask = left_pad(prompts, pad_id=0)
    out = hf_model.generate(
        input_ids=tokens,
        attention_mask=mask.long(),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=eos_token_id,
    )
    return out[:, tokens.shape[1] :]


HF_PROMPTS = [[17, 5, 42, 8, 91, 3, 60], [33, 7, 12]]


def test_greedy_matches_transformers(llama_pair):
    hf_model, ours = llama_pair
    expected = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10)
    assert torch.equal(generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0), expected)
    no_cache = generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0, use_cache=False)
    assert torch.equal(no_cache, expected)


def test_stop_token_matches_transformers_eos(llama_pair):
    hf_model, ours = llama_pair
    free = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10)
    eos = int(free[1, 3])  # row 1 emits it by step 3; row 0 continues (or stops too) exactly as in transformers
    expected = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10, eos_token_id=eos)
    ours_out = generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0, stop_tokens=[eos], pad_id=0)
    assert torch.equal(ours_out, expected)


def test_generate_next_token_samples_after_the_last_position(model):
    tokens = torch.tensor([PROMPTS[0]])
    positions = torch.arange(tokens.shape[1])[None]
    with torch.no_grad():
        next_token, logits = generate_next_token(model, positions, tokens, temperature=0.0)
        full = model(tokens)
    assert next_token.shape == (1, 1) and logits.shape == (1, 1, VOCAB)
    torch.testing.assert_close(logits[:, 0], full[:, -1])
    assert next_token.item() == full[0, -1].argmax().item()


@pytest.mark.parametrize("use_cache", [True, False])
def test_custom_generate_next_token_is_used_after_the_first_token(model, use_cache):
    calls = []

    def counting_next_token(*args, **kwargs):
        calls.append(kwargs["x"].shape[1])
        return generate_next_token(*args, **kwargs)

    plain = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0, use_cache=use_cache)
    custom = generate(
        model,
        PROMPTS,
        max_generated_tokens=5,
        temperature=0.0,
        use_cache=use_cache,
        custom_generate_next_token=counting_next_token,
    )
    assert torch.equal(custom, plain)
    assert len(calls) == 4  # tokens 2..5; the first comes from the prompt pass
    assert calls == ([1] * 4 if use_cache else [7, 8, 9, 10])  # one new token per step with a cache
    with pytest.raises(ValueError, match="top_p"):
        generate(model, PROMPTS, max_generated_tokens=2, top_p=0.9, custom_generate_next_token=counting_next_token)


def test_caches_disabled_by_the_caller_are_left_alone(model):
    want = generate(model, PROMPTS, max_generated_tokens=4, temperature=0.0, use_cache=False)
    model.setup_caches(batch_size=2, dtype=torch.float32)
    try:
        with disable_kv_cache(model):
            got = generate(model, PROMPTS, max_generated_tokens=4, temperature=0.0)
        assert all(layer.attn.kv_cache.size == 0 for layer in model.layers)
    finally:
        model.delete_caches()
    assert torch.equal(got, want)
