"""generate(): torchtune's return meaning (prompt + new tokens, and their logits) against a plain greedy loop and
torchtune 0.6.1's own outputs; KV cache vs recomputation, left padding, stop tokens, and parity with transformers'
greedy generate."""

import gc
import weakref

import pytest
import torch
from torch import nn

from tests.tune.generation._torchtune_reference import PADDED_PROMPT, VOCAB, call_kwargs, tiny_decoder
from tune.generation import generate, generate_next_token, left_pad
from tune.modules import TransformerDecoder, disable_kv_cache

PROMPTS = [[5, 9, 3, 7, 1, 2], [11, 4, 8]]  # different lengths: the second row is left-padded by 3
PROMPT_LEN = 6

# torchtune 0.6.1's generate and sample on tiny_decoder(), computed with torchtune's own environment by
# `python -m tests.tune.generation._torchtune_reference` (see that file): name -> (tokens, dtype, logits shape).
TORCHTUNE_OUTPUTS = {
    "greedy": (
        [[5, 9, 3, 7, 1, 2, 11, 47, 15, 51, 30, 3, 20, 44], [0, 0, 0, 11, 4, 8, 23, 28, 6, 38, 41, 48, 16, 9]],
        "torch.int64",
        [2, 8, 64],
    ),
    "stop": ([[5, 9, 3, 7, 1, 2, 11, 47, 15], [0, 0, 0, 11, 4, 8, 23, 0, 0]], "torch.int64", [2, 3, 64]),
    "rng": (
        [[5, 9, 3, 7, 1, 2, 32, 63, 42, 43, 48, 53], [0, 0, 0, 11, 4, 8, 14, 54, 59, 63, 27, 21]],
        "torch.int64",
        [2, 6, 64],
    ),
    "global_seed": (
        [[5, 9, 3, 7, 1, 2, 60, 42, 61, 12, 10, 53], [0, 0, 0, 11, 4, 8, 14, 6, 3, 8, 61, 4]],
        "torch.int64",
        [2, 6, 64],
    ),
}
GLOBAL_SEED = 5  # the seed of the "global_seed" call in _torchtune_reference.CALLS


@pytest.fixture(scope="module")
def model() -> TransformerDecoder:
    return tiny_decoder()


def _greedy_loop(model: nn.Module, prompt: list[int], num_tokens: int) -> tuple[list[int], torch.Tensor]:
    """The reference: one unpadded prompt, the whole sequence through ``model(...)`` at every step, argmax."""
    sequence, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(num_tokens):
            last = model(torch.tensor([sequence]))[0, -1]
            logits.append(last)
            sequence.append(int(last.argmax()))
    return sequence[len(prompt) :], torch.stack(logits)


@pytest.mark.parametrize("use_cache", [True, False])
def test_tokens_are_the_prompt_then_what_a_greedy_loop_generates(model, use_cache):
    tokens, logits = generate(model, PROMPTS, max_generated_tokens=7, temperature=0.0, use_cache=use_cache)
    assert tokens.shape == (2, PROMPT_LEN + 7) and tokens.dtype == torch.int64
    assert logits.shape == (2, 7, VOCAB) and logits.dtype == torch.float32
    padded, _ = left_pad(PROMPTS, pad_id=0)
    assert torch.equal(tokens[:, :PROMPT_LEN], padded)  # the prompt as given, padding included
    for row, prompt in enumerate(PROMPTS):
        new_tokens, new_logits = _greedy_loop(model, prompt, 7)
        assert tokens[row, PROMPT_LEN:].tolist() == new_tokens, row
        torch.testing.assert_close(logits[row], new_logits, rtol=0, atol=1e-5)
    assert not model.caches_are_enabled()  # caches set up by generate are removed again


@pytest.mark.parametrize("name", sorted(TORCHTUNE_OUTPUTS))
@pytest.mark.parametrize("use_cache", [True, False])
def test_equals_torchtune_outputs(model, name, use_cache):
    expected_tokens, dtype, logits_shape = TORCHTUNE_OUTPUTS[name]
    if name == "global_seed":
        torch.manual_seed(GLOBAL_SEED)
    tokens, logits = generate(model, torch.tensor(PADDED_PROMPT), use_cache=use_cache, **call_kwargs(name))
    assert tokens.tolist() == expected_tokens
    assert str(tokens.dtype) == dtype and list(logits.shape) == logits_shape


def test_prompt_shapes_and_dtypes(model):
    one_row, _ = generate(model, torch.tensor(PROMPTS[0]), max_generated_tokens=3, temperature=0.0)
    assert one_row.shape == (1, PROMPT_LEN + 3)  # a [s] prompt gives a batch of one, as in torchtune
    as_int32, _ = generate(model, torch.tensor([PROMPTS[0]], dtype=torch.int32), max_generated_tokens=3, temperature=0)
    assert as_int32.dtype == torch.int32 and torch.equal(as_int32.long(), one_row)  # the prompt's dtype is kept


def test_left_padded_rows_generate_what_they_would_alone(model):
    batched, _ = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0)
    for row, prompt in enumerate(PROMPTS):
        alone, _ = generate(model, torch.tensor(prompt), max_generated_tokens=10, temperature=0.0)
        assert torch.equal(batched[row, PROMPT_LEN:], alone[0, len(prompt) :]), row


def test_tensor_prompt_with_leading_padding_equals_list_prompt(model):
    tokens, _ = left_pad(PROMPTS, pad_id=0)
    assert tokens.tolist() == [[5, 9, 3, 7, 1, 2], [0, 0, 0, 11, 4, 8]]
    from_list, _ = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
    from_tensor, _ = generate(model, tokens, max_generated_tokens=5, temperature=0.0)
    assert torch.equal(from_tensor, from_list)


def test_stopped_rows_get_zero_tokens_and_zero_logits_whatever_the_pad_id(model):
    free, free_logits = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0, pad_id=63)
    new = free[:, PROMPT_LEN:]
    stop = int(new[0, 2])  # row 0 produces this token at step 2 (and maybe earlier); it ends row 0 there
    first = int((new[0] == stop).nonzero()[0])
    stopped, logits = generate(model, PROMPTS, max_generated_tokens=10, temperature=0.0, stop_tokens=[stop], pad_id=63)
    row1_stops = (new[1] == stop).nonzero()
    end1 = int(row1_stops[0]) + 1 if len(row1_stops) else new.shape[1]
    num_generated = max(first + 1, end1)  # generation ends as soon as every row has stopped
    assert stopped.shape == (2, PROMPT_LEN + num_generated) and logits.shape == (2, num_generated, VOCAB)
    for row, end in enumerate([first + 1, end1]):
        assert torch.equal(stopped[row, : PROMPT_LEN + end], free[row, : PROMPT_LEN + end]), row
        assert (stopped[row, PROMPT_LEN + end :] == 0).all(), row  # 0, not pad_id: torchtune's meaning
        torch.testing.assert_close(logits[row, :end], free_logits[row, :end], rtol=0, atol=1e-5)
        assert (logits[row, end:] == 0).all(), row


@pytest.mark.parametrize("use_cache", [True, False])
def test_without_logits_the_tokens_are_the_same_and_no_logits_are_kept(model, use_cache):
    kwargs = dict(max_generated_tokens=10, temperature=0.9, top_k=20, stop_tokens=[11, 23], use_cache=use_cache)
    with_logits, logits = generate(model, PROMPTS, rng=torch.Generator().manual_seed(4), **kwargs)
    outputs, alive = [], []  # the model's logits so far; at each forward pass, how many earlier ones are alive

    def count(module, args, output):
        gc.collect()
        alive.append(sum(ref() is not None for ref in outputs))
        outputs.append(weakref.ref(output))

    handle = model.register_forward_hook(count)
    try:
        tokens, none = generate(model, PROMPTS, rng=torch.Generator().manual_seed(4), return_logits=False, **kwargs)
    finally:
        handle.remove()
    assert none is None and logits is not None
    assert torch.equal(tokens, with_logits)  # same length too: stop tokens still end the rows
    assert len(alive) == with_logits.shape[1] - PROMPT_LEN
    assert max(alive) <= 1  # at most the previous step's logits (held until the next step replaces them)


def test_sampling_is_reproducible_and_cache_independent(model):
    kwargs = dict(max_generated_tokens=8, temperature=0.9, top_k=20, top_p=0.9)
    cached, _ = generate(model, PROMPTS, rng=torch.Generator().manual_seed(3), **kwargs)
    recomputed, _ = generate(model, PROMPTS, rng=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    assert torch.equal(cached, recomputed)


def test_a_generator_per_row_samples_each_row_as_it_would_alone(model):
    # one generator per row: a row's tokens do not depend on the rows generated with it
    kwargs = dict(max_generated_tokens=8, temperature=1.0, top_k=20)
    batched, _ = generate(model, PROMPTS, rng=[torch.Generator().manual_seed(row) for row in (11, 12)], **kwargs)
    for row, prompt in enumerate(PROMPTS):
        alone, _ = generate(model, [prompt], rng=[torch.Generator().manual_seed(11 + row)], **kwargs)
        assert torch.equal(batched[row, PROMPT_LEN:], alone[0, len(prompt) :]), row
    one_generator, _ = generate(model, PROMPTS, rng=torch.Generator().manual_seed(11), **kwargs)
    assert not torch.equal(one_generator, batched)  # the per-row draws are not the batch generator's
    with pytest.raises(ValueError, match="2 prompts"):
        generate(model, PROMPTS, rng=[torch.Generator()], **kwargs)


def test_caller_caches_are_reset_and_kept(model):
    model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=40)
    try:
        first, _ = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
        second, _ = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0)
        assert torch.equal(first, second)
        assert model.caches_are_enabled()
    finally:
        model.delete_caches()
    recomputed, _ = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0, use_cache=False)
    assert torch.equal(first, recomputed)


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
    return out


HF_PROMPTS = [[17, 5, 42, 8, 91, 3, 60], [33, 7, 12]]


def test_greedy_matches_transformers(llama_pair):
    hf_model, ours = llama_pair
    expected = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10)  # prompt + new tokens, as ours
    assert torch.equal(generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0)[0], expected)
    no_cache, _ = generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0, use_cache=False)
    assert torch.equal(no_cache, expected)


def test_stop_token_matches_transformers_eos(llama_pair):
    hf_model, ours = llama_pair
    free = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10)[:, len(HF_PROMPTS[0]) :]
    eos = int(free[1, 3])  # row 1 emits it by step 3; row 0 continues (or stops too) exactly as in transformers
    expected = _hf_greedy(hf_model, HF_PROMPTS, max_new_tokens=10, eos_token_id=eos)
    ours_out, _ = generate(ours, HF_PROMPTS, max_generated_tokens=10, temperature=0.0, stop_tokens=[eos], pad_id=0)
    assert torch.equal(ours_out, expected)  # transformers pads a finished row with pad_token_id=0, torchtune with 0


def test_generate_next_token_samples_after_the_last_position(model):
    tokens = torch.tensor([PROMPTS[0]])
    positions = torch.arange(tokens.shape[1])[None]
    with torch.no_grad():
        next_token, logits = generate_next_token(model, positions, tokens, temperature=0.0)
        full = model(tokens)
    assert next_token.shape == (1, 1) and next_token.dtype == torch.int32 and logits.shape == (1, 1, VOCAB)
    torch.testing.assert_close(logits[:, 0], full[:, -1])
    assert next_token.item() == full[0, -1].argmax().item()


@pytest.mark.parametrize("use_cache", [True, False])
def test_custom_generate_next_token_is_used_after_the_first_token(model, use_cache):
    calls = []

    def counting_next_token(*args, **kwargs):
        calls.append(kwargs["x"].shape[1])
        return generate_next_token(*args, **kwargs)

    plain, _ = generate(model, PROMPTS, max_generated_tokens=5, temperature=0.0, use_cache=use_cache)
    custom, _ = generate(
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
    want, _ = generate(model, PROMPTS, max_generated_tokens=4, temperature=0.0, use_cache=False)
    model.setup_caches(batch_size=2, dtype=torch.float32)
    try:
        with disable_kv_cache(model):
            got, _ = generate(model, PROMPTS, max_generated_tokens=4, temperature=0.0)
        assert all(layer.attn.kv_cache.size == 0 for layer in model.layers)
    finally:
        model.delete_caches()
    assert torch.equal(got, want)
