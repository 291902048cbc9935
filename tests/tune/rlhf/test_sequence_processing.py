"""tune/rlhf/_sequence_processing.py: sequence log-probabilities against TRL's, and the trimming of generations."""

import contextlib

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tune.models.llama3_2 import lora_llama3_2
from tune.modules import TiedLinear
from tune.modules.peft import LoRALinear, disable_adapter
from tune.rlhf import (
    PreferenceMetrics,
    completion_logit_sums,
    get_batch_log_probs,
    get_reward_penalty_mask,
    logits_to_logprobs,
    model_sequence_log_probs,
    sequence_log_probs,
    truncate_sequence_at_first_stop_token,
    truncate_sequence_for_logprobs,
)


def _logits_and_labels(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 17, generator=gen, dtype=dtype) * 3
    labels = torch.randint(0, 17, (4, 9), generator=gen)
    labels[:, :3] = -100  # the prompt
    labels[1, 6:] = -100  # right padding
    labels[2, 3:] = -100  # nothing to score: sum 0, mean 0
    return logits, labels


@pytest.mark.parametrize("average", [False, True])
def test_get_batch_log_probs_equals_trl(average):
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    logits, labels = _logits_and_labels(torch.float64)
    ours = get_batch_log_probs(logits, labels, return_average_logprobs=average)
    expected = cpo.CPOTrainer.get_batch_logps(logits, labels.clone(), average_log_prob=average)
    keep = torch.tensor([True, True, not average, True])  # TRL divides 0 by 0 for a row with no scored token
    torch.testing.assert_close(ours[keep], expected[keep], atol=1e-12, rtol=0)
    assert ours[2] == 0


def test_get_batch_log_probs_is_float32_and_by_hand():
    logits, labels = _logits_and_labels(torch.bfloat16)
    ours = get_batch_log_probs(logits, labels)
    assert ours.dtype == torch.float32
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    row, expected = 1, 0.0
    for t in range(1, 9):
        if labels[row, t] != -100:
            expected += log_probs[row, t - 1, labels[row, t]].item()
    assert ours[row].item() == pytest.approx(expected, abs=1e-5)


def test_get_batch_log_probs_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"logits \[b, s, v\] and labels \[b, s\]"):
        get_batch_log_probs(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))


def test_logits_to_logprobs_and_truncation_for_logprobs():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=gen)
    tokens = torch.randint(0, 11, (2, 6), generator=gen)
    out = logits_to_logprobs(logits, tokens, temperature=0.7)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(out, expected)
    # [query of 2 | response of 4]: positions 1..4 predict the response
    assert torch.equal(truncate_sequence_for_logprobs(logits, 2), logits[:, 1:5])


def test_truncate_sequence_at_first_stop_token():
    sequences = torch.tensor([[869, 30, 869], [2, 30, 869], [50, 30, 869], [13, 30, 5], [13, 2, 2], [2, 2, 2]])
    mask, truncated = truncate_sequence_at_first_stop_token(sequences.clone(), torch.tensor([2, 869]), fill_value=0)
    assert truncated.tolist() == [[869, 0, 0], [2, 0, 0], [50, 30, 869], [13, 30, 5], [13, 2, 0], [2, 0, 0]]
    assert mask.tolist() == [
        [False, True, True],
        [False, True, True],
        [False, False, False],
        [False, False, False],
        [False, False, True],
        [False, True, True],
    ]


def test_get_reward_penalty_mask():
    padding = torch.tensor([[False, False, True], [False, False, False], [False, True, True]])
    lengths = torch.tensor([2, 3, 1])
    assert get_reward_penalty_mask(padding, lengths).tolist() == [False, True, False]
    assert get_reward_penalty_mask(padding, lengths, min_response_length=2).tolist() == [False, True, True]
    assert get_reward_penalty_mask(padding, lengths, penalise_no_eos=False).tolist() == [False, False, False]


def _projections(vocab: int, dim: int, gen: torch.Generator) -> dict[str, nn.Module]:
    """Output layers of every kind sequence_log_probs handles: frozen plain weights (gradients computed in the
    forward pass), a LoRA output layer and a trained tied embedding (chunks under activation checkpointing)."""
    frozen = nn.Linear(dim, vocab, bias=False).requires_grad_(False)
    lora = LoRALinear(dim, vocab, rank=4, alpha=8.0)
    lora.weight.requires_grad_(False)
    nn.init.normal_(lora.lora_b.weight, generator=gen)  # a trained adapter: B is no longer zero
    embedding = nn.Embedding(vocab, dim)
    return {
        "frozen_linear": frozen,
        "lora_output": lora,
        "frozen_tied": TiedLinear(nn.Embedding(vocab, dim).requires_grad_(False)),
        "trained_tied": TiedLinear(embedding),
    }


@pytest.mark.parametrize("select_labelled", [True, False], ids=["labelled_only", "every_position"])
@pytest.mark.parametrize("average", [False, True])
def test_sequence_log_probs_equal_the_logits_path_and_never_hold_full_logits(average, select_labelled):
    """sequence_log_probs against get_batch_log_probs + PreferenceMetrics on the full logits: values, the logits metrics
    within 1e-6, every gradient within 1e-5 relative; no tensor of the call (forward or backward) spans more than
    ``chunk_size`` positions of the vocabulary. Both ways: the labelled positions gathered (CPU) or every position
    projected and the others zeroed (accelerators, where gathering them would synchronise)."""
    torch.manual_seed(0)  # LoRALinear initialises its A matrix from the global generator
    gen = torch.Generator().manual_seed(0)
    num_rows, seq_len, dim, vocab, chunk_size = 6, 11, 16, 37, 8
    labels = torch.randint(0, vocab, (num_rows, seq_len), generator=gen)
    labels[:, :4] = -100  # the prompts
    labels[1, 8:] = -100  # right padding
    labels[4, 4:] = -100  # a row without completion tokens: 0, as get_batch_log_probs gives
    row_weights = torch.randn(num_rows, generator=gen)  # a loss that weighs the rows differently, as DPO's does
    for name, projection in _projections(vocab, dim, gen).items():
        hidden = torch.randn(num_rows, seq_len, dim, generator=gen, requires_grad=True)
        logits = projection(hidden)
        expected = get_batch_log_probs(logits, labels, return_average_logprobs=average)
        metrics = PreferenceMetrics(torch.device("cpu"))
        zeros = torch.zeros(num_rows // 2)
        metrics.update(zeros, zeros, zeros, zeros, logits, labels)
        params = [hidden, *(p for p in projection.parameters() if p.requires_grad)]
        expected_grads = torch.autograd.grad((expected * row_weights).sum(), params)

        with _LargestVocabTensor(vocab, dim) as largest:
            out = sequence_log_probs(
                hidden,
                labels,
                projection,
                average_log_probs=average,
                chunk_size=chunk_size,
                select_labelled=select_labelled,
            )
            grads = torch.autograd.grad((out.log_probs * row_weights).sum(), params)
        assert 0 < largest.rows <= chunk_size, (name, largest.rows)  # never [b, s, v], in forward or backward
        torch.testing.assert_close(out.log_probs, expected, atol=1e-6, rtol=0, msg=name)
        for grad, expected_grad in zip(grads, expected_grads):
            # relative as well: the LoRA A gradient sums 50 tokens' contributions of magnitude up to 70 in float32
            # (in another order than the full-logits path), so 1e-6 relative fails on rounding for some draws
            torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5, msg=name)
        assert out.num_tokens.tolist() == (labels[:, 1:] != -100).sum(dim=1).tolist()
        sums, counts = completion_logit_sums(logits, labels)
        torch.testing.assert_close(out.logit_sums, sums, atol=1e-6, rtol=0, msg=name)
        from_sums = PreferenceMetrics(torch.device("cpu"))
        from_sums.update(zeros, zeros, zeros, zeros, logit_sums=out.logit_sums, num_tokens=out.num_tokens)
        full, reduced = metrics.compute(), from_sums.compute()
        for key in ("logits/chosen", "logits/rejected"):
            assert reduced[key] == pytest.approx(full[key], abs=1e-6), (name, key)


class _LargestVocabTensor(TorchDispatchMode):
    """Records the most rows of any tensor with a last dimension of ``vocab`` that an operator produced, the
    ``[dim, vocab]`` ones aside (the transposed projection weight and its gradient)."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.vocab, self.dim, self.rows = vocab, dim, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[-1] != self.vocab:
                continue
            if tuple(tensor.shape) != (self.dim, self.vocab):
                self.rows = max(self.rows, tensor.numel() // self.vocab)
        return out


def test_model_sequence_log_probs_projects_a_decoders_hidden_states_and_takes_a_users_logits():
    """A tune decoder is scored from its hidden states (skip_output_layer set for the call only), with LoRA on its
    output layer disabled together with the others; a model without ``output`` is taken to return logits."""
    torch.manual_seed(0)
    model = lora_llama3_2(
        lora_attn_modules=["q_proj", "v_proj"],
        apply_lora_to_output=True,
        vocab_size=53,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        embed_dim=16,
        max_seq_len=32,
        intermediate_dim=24,
        lora_rank=2,
        lora_alpha=4.0,
        tie_word_embeddings=False,
    )
    for module in model.modules():
        if isinstance(module, LoRALinear):
            nn.init.normal_(module.lora_b.weight)
    tokens = torch.randint(0, 53, (4, 9))
    labels = tokens.clone()
    labels[:, :3] = -100
    for adapters_off in (False, True):
        with disable_adapter(model) if adapters_off else contextlib.nullcontext():
            out = model_sequence_log_probs(model, tokens, labels)
            assert model.skip_output_layer is False
            logits = model(tokens)
            user_model = model_sequence_log_probs(lambda t: model(t), tokens, labels)
        torch.testing.assert_close(out.log_probs, get_batch_log_probs(logits, labels), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.log_probs, user_model.log_probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.logit_sums, completion_logit_sums(logits, labels)[0], atol=1e-5, rtol=0)
