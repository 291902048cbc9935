"""tune/rlhf/_sequence_processing.py on padding-free rows (tune.data.padding_free_collate_dpo): every per-sequence
value equals the padded batch's (tune.data.padded_collate_dpo) on a tiny decoder.

The decoder runs in float64, so that 1e-6 is a bound on the layouts' difference and not on float32 rounding (a
float32 sum of about -40 has a resolution of 4e-6)."""

import pytest
import torch

from tune.data import padded_collate_dpo, padding_free_collate_dpo, preference_batch
from tune.models.llama2 import llama2
from tune.rlhf import chosen_nll_labels, model_sequence_log_probs
from tune.training import ContextParallel

VOCAB = 64


def _model(frozen_output: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = llama2(
        vocab_size=VOCAB,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=32,
        max_seq_len=128,
        intermediate_dim=48,
    )
    model.to(torch.float64)
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    model.output.weight.requires_grad_(not frozen_output)  # frozen: the fused-gradient projection path
    return model


def _pairs() -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    pairs = []
    for prompt_len, chosen_len, rejected_len in [(3, 4, 7), (5, 1, 2), (2, 9, 3)]:
        prompt = torch.randint(1, VOCAB, (prompt_len,), generator=gen).tolist()
        pair = {}
        for side, n in (("chosen", chosen_len), ("rejected", rejected_len)):
            completion = torch.randint(1, VOCAB, (n,), generator=gen).tolist()
            pair[f"{side}_input_ids"] = prompt + completion
            pair[f"{side}_labels"] = [-100] * prompt_len + completion
        pairs.append(pair)
    return pairs


@pytest.mark.parametrize("frozen_output", [True, False])
@pytest.mark.parametrize("average", [False, True])
def test_packed_values_and_gradients_equal_padded(frozen_output, average):
    model = _model(frozen_output)
    results, grads = [], []
    for collate in (padded_collate_dpo, padding_free_collate_dpo):
        batch = preference_batch(collate(_pairs()))
        nll_labels = chosen_nll_labels(batch.tokens, batch.labels, seq_lens=batch.seq_lens)
        scores = model_sequence_log_probs(
            model, batch.tokens, batch.labels, average_log_probs=average, nll_labels=nll_labels, **batch.packed
        )
        model.zero_grad()
        (scores.log_probs.sum() + scores.nll_sums.sum()).backward()
        results.append(scores)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    padded, packed = results
    assert packed.log_probs.shape == (6,)
    for name in ("log_probs", "logit_sums", "nll_sums"):
        torch.testing.assert_close(getattr(packed, name), getattr(padded, name), atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(packed.num_tokens, torch.tensor([4, 1, 9, 7, 2, 3]))
    torch.testing.assert_close(packed.num_tokens, padded.num_tokens)
    torch.testing.assert_close(packed.nll_tokens, padded.nll_tokens)
    assert packed.nll_tokens[3:].eq(0).all() and packed.nll_tokens[:3].tolist() == [6, 5, 10]
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_chosen_nll_labels_count_the_same_tokens():
    pairs = _pairs()
    padded = preference_batch(padded_collate_dpo(pairs))
    packed = preference_batch(padding_free_collate_dpo(pairs))
    padded_nll = chosen_nll_labels(padded.tokens, padded.labels)
    packed_nll = chosen_nll_labels(packed.tokens, packed.labels, seq_lens=packed.seq_lens)
    # the same labelled tokens, position 0 of each sequence excluded (it predicts nothing in either layout)
    expected = torch.cat([row[1:n] for row, n in zip(padded_nll, packed.seq_lens)])
    starts = packed.seq_lens.cumsum(0) - packed.seq_lens
    keep = torch.ones(packed.tokens.shape[1], dtype=torch.bool)
    keep[starts] = False
    torch.testing.assert_close(packed_nll[0, keep], expected)
    assert packed_nll[0, starts].eq(-100).all()


def test_refuses_packed_rows_where_they_cannot_run():
    batch = preference_batch(padding_free_collate_dpo(_pairs()))
    with pytest.raises(ValueError, match="padding-free batches are scored with tune decoders"):
        model_sequence_log_probs(
            lambda tokens: torch.zeros(*tokens.shape, VOCAB), batch.tokens, batch.labels, **batch.packed
        )

    class _Enabled(ContextParallel):
        def __init__(self):
            pass

        enabled = True

    with pytest.raises(ValueError, match="context parallelism cuts padded rows"):
        model_sequence_log_probs(_model(True), batch.tokens, batch.labels, context_parallel=_Enabled(), **batch.packed)
