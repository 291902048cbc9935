"""TransformerDecoder behaviour: hidden-state output, packed documents, KV-cache decoding, errors."""

import copy

import pytest
import torch

from tune.models.llama3_2 import llama3_2
from tune.modules import (
    TiedLinear,
    TransformerDecoder,
    get_block_causal_mask_from_document_ids,
)


def _model(**overrides) -> TransformerDecoder:
    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=53, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=24, intermediate_dim=40
    )
    kwargs.update(overrides)
    return llama3_2(**kwargs).eval()


TOKENS = torch.randint(0, 53, (2, 10), generator=torch.Generator().manual_seed(1))


def test_skip_output_layer_returns_normed_hidden_states():
    model = _model()
    with torch.no_grad():
        logits = model(TOKENS)
        model.skip_output_layer = True
        hidden = model(TOKENS)
    assert hidden.shape == (2, 10, 32) and logits.shape == (2, 10, 53)
    assert torch.allclose(model.output(hidden), logits)


def test_packed_documents_equal_separate_forwards():
    model = _model()
    doc_a, doc_b = TOKENS[0, :4], TOKENS[1, :6]
    packed = torch.cat([doc_a, doc_b])[None]
    mask = get_block_causal_mask_from_document_ids(torch.tensor([[0] * 4 + [1] * 6]))
    positions = torch.cat([torch.arange(4), torch.arange(6)])[None]
    with torch.no_grad():
        out = model(packed, mask=mask, input_pos=positions)
        separate = torch.cat([model(doc_a[None]), model(doc_b[None])], dim=1)
    assert torch.allclose(out, separate, atol=1e-5)


def test_kv_cache_decoding_matches_full_forward():
    model = _model()
    assert not model.caches_are_enabled()
    with torch.no_grad():
        full = model(TOKENS)
        model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=16)
        assert model.caches_are_enabled()
        for _ in range(2):  # the second round checks reset_caches
            steps = [model(TOKENS[:, :6])] + [model(TOKENS[:, i : i + 1]) for i in range(6, 10)]
            assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
            model.reset_caches()
    model.delete_caches()
    assert not model.caches_are_enabled()
    with pytest.raises(RuntimeError, match="setup_caches"):
        model.reset_caches()


def test_tied_output_shares_the_embedding_weight():
    model = _model(tie_word_embeddings=True)
    assert isinstance(model.output, TiedLinear)
    assert model.output.weight is model.tok_embeddings.weight
    assert "output.weight" not in model.state_dict()
    untied = _model(tie_word_embeddings=False)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 53 * 32
    for copied in (copy.deepcopy(model), model.to(torch.bfloat16)):
        assert copied.output.weight is copied.tok_embeddings.weight


def test_tied_linear_softcapping_bounds_logits():
    embedding = torch.nn.Embedding(5, 3)
    with torch.no_grad():
        embedding.weight.mul_(100)
    capped = TiedLinear(embedding, softcapping=2.0)(torch.ones(1, 3))
    assert capped.abs().max() <= 2.0
    assert torch.allclose(capped, 2.0 * torch.tanh(torch.ones(1, 3) @ embedding.weight.T / 2.0))


def test_input_errors_are_reported():
    model = _model()
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        model(TOKENS[0])
    with pytest.raises(ValueError, match="max_seq_len 24"):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_one_layer_and_num_layers_stack_independent_copies():
    source = _model(num_layers=1)
    layer = source.layers[0]
    model = TransformerDecoder(
        tok_embeddings=source.tok_embeddings,
        layers=layer,
        num_layers=3,
        max_seq_len=24,
        num_heads=4,
        head_dim=8,
        norm=source.norm,
        output=source.output,
    )
    assert len(model.layers) == 3 and all(copied is not layer for copied in model.layers)
    assert model.layers[0].attn.q_proj.weight.data_ptr() != model.layers[1].attn.q_proj.weight.data_ptr()
    torch.testing.assert_close(model.layers[2].attn.q_proj.weight, layer.attn.q_proj.weight)
    common = dict(tok_embeddings=source.tok_embeddings, max_seq_len=24, num_heads=4, head_dim=8, norm=source.norm)
    with pytest.raises(ValueError, match="num_layers"):
        TransformerDecoder(layers=[layer], num_layers=2, output=source.output, **common)
    with pytest.raises(ValueError, match="num_layers"):
        TransformerDecoder(layers=layer, output=source.output, **common)


def test_output_hidden_states_returns_the_inputs_of_the_chosen_layers_then_the_logits():
    model = _model(num_layers=3)
    inputs = {}
    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda mod, args, i=i: inputs.__setitem__(i, args[0].clone()))
    with torch.no_grad():
        logits = model(TOKENS)
        model.output_hidden_states = [0, 2]
        outputs = model(TOKENS)
    assert isinstance(outputs, list) and len(outputs) == 3
    torch.testing.assert_close(outputs[0], inputs[0])  # layer 0's input: the embeddings
    torch.testing.assert_close(outputs[1], inputs[2])
    torch.testing.assert_close(outputs[2], logits)


def test_set_num_output_chunks_returns_logits_in_sequence_chunks_for_the_chunked_loss():
    from tune.modules.loss import CEWithChunkedOutputLoss

    model = _model()
    labels = TOKENS.roll(-1, dims=1)
    with torch.no_grad():
        logits = model(TOKENS)
        model.set_num_output_chunks(4)
        chunks = model(TOKENS)
    assert isinstance(chunks, list) and len(chunks) == 4
    torch.testing.assert_close(torch.cat(chunks, dim=1), logits)
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 53), labels.reshape(-1))
    torch.testing.assert_close(CEWithChunkedOutputLoss(4)(chunks, labels), mean)  # torchtune's loop, unchanged
