"""Chunked cross-entropy losses against ``F.cross_entropy`` on full logits (the reference), plus peak memory."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.modules import TiedLinear
from tune.modules.loss import CEWithChunkedOutputLoss, LinearCrossEntropyLoss, shift_labels
from tune.modules.peft import LoRALinear

IGNORE = -100
ROOT = Path(__file__).resolve().parents[4]


def _data(batch=3, seq=11, dim=16, vocab=50, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, dim, generator=gen, dtype=dtype)
    weight = torch.randn(vocab, dim, generator=gen, dtype=dtype) * 0.3
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    # uneven padding and a masked prompt, so chunk boundaries cut through ignored positions
    labels[0, 7:] = IGNORE
    labels[1, :3] = IGNORE
    labels[2, 9:] = IGNORE
    return hidden, weight, labels


def _reference(hidden, weight, labels):
    logits = hidden @ weight.T  # full [b, s, vocab] logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="sum")


def _loss_and_grads(loss_fn, hidden, weight, labels):
    hidden = hidden.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    loss = loss_fn(hidden, weight, labels)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def test_shift_labels_moves_targets_left_and_pads_with_ignore_index():
    labels = torch.tensor([[1, 2, 3, 4], [5, 6, IGNORE, IGNORE]])
    expected = torch.tensor([[2, 3, 4, IGNORE], [6, IGNORE, IGNORE, IGNORE]])
    assert torch.equal(shift_labels(labels), expected)
    with pytest.raises(ValueError, match="batch, seq_len"):
        shift_labels(labels[0])


@pytest.mark.parametrize("num_chunks", [1, 3, 8])
@pytest.mark.parametrize("mask_ignored_tokens", [True, False])
def test_linear_cross_entropy_equals_full_logits_cross_entropy(num_chunks, mask_ignored_tokens):
    hidden, weight, labels = _data()
    chunked = LinearCrossEntropyLoss(
        num_output_chunks=num_chunks, mask_ignored_tokens=mask_ignored_tokens, reduction="sum"
    )
    got = _loss_and_grads(lambda h, w, y: chunked(h, y, output=w), hidden, weight, labels)
    want = _loss_and_grads(_reference, hidden, weight, labels)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_linear_cross_entropy_uses_the_model_output_module_and_mean_reduction():
    hidden, weight, labels = _data()

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.output = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            self.skip_output_layer = False

    model = Decoder()
    with torch.no_grad():
        model.output.weight.copy_(weight)
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=4, reduction="mean")
    loss_fn.set_model_output(model)
    assert model.skip_output_layer is True
    assert list(loss_fn.parameters()) == []  # the model keeps owning the projection
    loss = loss_fn(hidden, labels)
    want = _reference(hidden, weight, labels) / (labels != IGNORE).sum()
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-6)
    loss.backward()
    assert model.output.weight.grad is not None


def _output_module(kind, dim, vocab):
    if kind == "linear":
        return nn.Linear(dim, vocab, bias=False)
    if kind == "tied":
        return TiedLinear(nn.Embedding(vocab, dim))
    lora = LoRALinear(dim, vocab, rank=4, alpha=8.0)
    nn.init.normal_(lora.lora_b.weight)  # LoRA B starts at zero; make the adapter change the logits
    return lora


@pytest.mark.parametrize("kind", ["linear", "tied", "lora"])
def test_linear_cross_entropy_applies_any_output_module(kind):
    # the projection is called as a module, so tied embeddings and LoRA adapters on the output take part
    torch.manual_seed(0)
    hidden, _, labels = _data()
    output = _output_module(kind, hidden.shape[-1], 50)
    params = [p for p in output.parameters() if p.requires_grad] or [output.weight]
    chunked = LinearCrossEntropyLoss(num_output_chunks=4, reduction="sum")(hidden, labels, output=output)
    got = torch.autograd.grad(chunked, params)
    logits = output(hidden)
    full = F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), reduction="sum")
    want = torch.autograd.grad(full, params)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_linear_cross_entropy_chunks_in_model_dtype_then_upcasts():
    # bf16 model: logits of each chunk are computed in bf16 and only then upcast (as a bf16 model's logits would be)
    hidden, weight, labels = _data(dtype=torch.bfloat16)
    loss = LinearCrossEntropyLoss(num_output_chunks=5, reduction="sum")(hidden, labels, output=weight)
    logits_bf16 = hidden @ weight.T
    want = F.cross_entropy(logits_bf16.float().reshape(-1, weight.shape[0]), labels.reshape(-1), reduction="sum")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want, atol=1e-3, rtol=1e-5)


def test_linear_cross_entropy_all_ignored_gives_zero_loss_and_grads():
    hidden, weight, labels = _data()
    labels.fill_(IGNORE)
    loss, hidden_grad, weight_grad = _loss_and_grads(
        lambda h, w, y: LinearCrossEntropyLoss(reduction="sum")(h, y, output=w), hidden, weight, labels
    )
    assert loss.item() == 0.0
    assert hidden_grad is None or hidden_grad.abs().sum() == 0
    assert LinearCrossEntropyLoss(reduction="mean")(hidden, labels, output=weight).item() == 0.0


def test_linear_cross_entropy_errors_are_actionable():
    hidden, weight, labels = _data()
    with pytest.raises(ValueError, match="set_model_output"):
        LinearCrossEntropyLoss()(hidden, labels)
    with pytest.raises(ValueError, match="disagree"):
        LinearCrossEntropyLoss()(hidden, labels[:, :-1], output=weight)
    with pytest.raises(ValueError, match="num_output_chunks"):
        LinearCrossEntropyLoss(num_output_chunks=0)
    with pytest.raises(ValueError, match="reduction"):
        CEWithChunkedOutputLoss(reduction="none")
    with pytest.raises(ValueError, match="no `output`"):
        LinearCrossEntropyLoss().set_model_output(nn.Linear(2, 2))


@pytest.mark.parametrize("as_list", [False, True])
def test_chunked_output_loss_equals_full_logits_cross_entropy(as_list):
    hidden, weight, labels = _data()
    loss_fn = CEWithChunkedOutputLoss(num_output_chunks=4, reduction="sum")

    def chunked(h, w, y):
        logits = h @ w.T
        return loss_fn(list(logits.chunk(4, dim=1)) if as_list else logits, y)

    got = _loss_and_grads(chunked, hidden, weight, labels)
    want = _loss_and_grads(_reference, hidden, weight, labels)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="positions"):
        loss_fn(hidden @ weight.T, labels[:, :5])


# Peak resident memory of one forward+backward of each loss, in a fresh process: the kernel's peak-RSS counter
# (VmHWM) is reset just before, so the peak above the RSS at that moment is what the loss itself needed.
_PROBE = textwrap.dedent(
    """
    import json, re, sys
    import torch, torch.nn.functional as F
    from tune.modules.loss import LinearCrossEntropyLoss
    def kib(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokens, dim, vocab = 1024, 64, 32000
    hidden = torch.randn(1, tokens, dim, requires_grad=True)
    weight = (torch.randn(vocab, dim) * 0.02).requires_grad_(True)
    labels = torch.randint(0, vocab, (1, tokens))
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    before = kib("VmRSS")
    if sys.argv[1] == "full":
        logits = hidden @ weight.T
        loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="sum")
    else:
        loss = LinearCrossEntropyLoss(num_output_chunks=8, reduction="sum")(hidden, labels, output=weight)
    loss.backward()
    print(json.dumps({"peak_increase_mib": (kib("VmHWM") - before) / 1024, "loss": loss.item()}))
    """
)


def _probe(mode: str) -> dict:
    # A fixed mmap threshold makes glibc return every large block to the OS when it is freed; its default
    # (adaptive) threshold keeps freed blocks in the heap, so peak RSS would count dead chunks as live.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"memory probe ({mode}) failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="reads and resets the peak RSS through Linux's /proc")
def test_linear_cross_entropy_peak_memory_is_lower_than_full_logits():
    full, chunked = _probe("full"), _probe("chunked")
    # same loss from both paths (fp32 sums over 1024 tokens)
    assert chunked["loss"] == pytest.approx(full["loss"], rel=1e-5)
    # full fp32 logits are 1024 * 32000 * 4 B = 125 MiB, and backward holds about two more of that size;
    # the chunked path holds about one chunk (1/8) of it at a time
    full_mib, chunked_mib = full["peak_increase_mib"], chunked["peak_increase_mib"]
    print(f"peak RSS increase: full logits {full_mib:.0f} MiB, chunked {chunked_mib:.0f} MiB")
    assert full["peak_increase_mib"] > 300
    assert chunked["peak_increase_mib"] < full["peak_increase_mib"] / 3


def test_linear_cross_entropy_on_a_tune_decoder_equals_cross_entropy_on_its_logits():
    from tune.models.llama3 import llama3

    torch.manual_seed(0)
    model = llama3(
        vocab_size=64, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=16, intermediate_dim=32
    )
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    labels = tokens.clone()
    labels[1, 7:] = IGNORE
    labels = shift_labels(labels)
    logits = model(tokens)  # [b, s, vocab]
    want = F.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1), reduction="sum")
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=3, reduction="sum")
    loss_fn.set_model_output(model)
    hidden = model(tokens)  # now [b, s, embed_dim]
    assert hidden.shape == (2, 12, 16)
    torch.testing.assert_close(loss_fn(hidden, labels), want, atol=1e-5, rtol=1e-5)


class _LinearSubclass(nn.Linear):
    """Not a plain nn.Linear: the loss must call it (checkpointed chunks) rather than read its weight."""


@pytest.mark.parametrize("mask_ignored_tokens", [True, False])
def test_fused_gradients_equal_the_checkpointed_path(mask_ignored_tokens):
    # nn.Linear takes the fused path (gradients made in forward), the subclass the checkpointed one
    hidden, weight, labels = _data(seq=40)
    results = []
    for cls in (nn.Linear, _LinearSubclass):
        output = cls(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            output.weight.copy_(weight)
        h = hidden.clone().requires_grad_(True)
        loss = LinearCrossEntropyLoss(5, mask_ignored_tokens=mask_ignored_tokens, reduction="sum")(
            h, labels, output=output
        )
        (2.5 * loss).backward()  # a non-unit upstream gradient, as the recipes' loss scale gives
        results.append((loss.detach(), h.grad, output.weight.grad))
    for fused, checkpointed in zip(*results):
        torch.testing.assert_close(fused, checkpointed, atol=1e-5, rtol=1e-5)


def test_fused_path_with_a_frozen_projection_gives_only_hidden_gradients():
    hidden, weight, labels = _data()  # weight does not require grad, as a frozen output layer under LoRA
    h, ref_h = hidden.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
    LinearCrossEntropyLoss(3, reduction="sum")(h, labels, output=weight).backward()
    _reference(ref_h, weight, labels).backward()
    assert weight.grad is None
    torch.testing.assert_close(h.grad, ref_h.grad, atol=1e-5, rtol=1e-5)


def test_fused_path_bfloat16_gradients_match_autograd_on_bfloat16_logits():
    hidden, weight, labels = _data(dtype=torch.bfloat16)
    got = _loss_and_grads(
        lambda h, w, y: LinearCrossEntropyLoss(4, reduction="sum")(h, y, output=w), hidden, weight, labels
    )

    def reference(h, w, y):  # bf16 logits upcast to fp32 for the softmax, as the chunked loss does
        logits = (h @ w.T).float()
        return F.cross_entropy(logits.reshape(-1, w.shape[0]), y.reshape(-1), reduction="sum")

    want = _loss_and_grads(reference, hidden, weight, labels)
    torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=1e-5)
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)


def test_fused_path_refuses_a_second_backward():
    hidden, weight, labels = _data()
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = LinearCrossEntropyLoss(2, reduction="sum")(h, labels, output=w)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


def test_projection_with_forward_hook_is_called_as_a_module():
    hidden, weight, labels = _data()
    output = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    calls = []
    output.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    h = hidden.clone().requires_grad_(True)
    LinearCrossEntropyLoss(2, reduction="sum")(h, labels, output=output).backward()
    assert len(calls) >= 2  # the forward chunks (and their recomputation in backward)


def test_small_vocabularies_get_fewer_larger_chunks_with_the_same_loss():
    loss_fn = LinearCrossEntropyLoss(
        num_output_chunks=8, reduction="sum"
    )  # min_chunk_mib=32: 1,048 rows of an 8,000-token vocab
    assert loss_fn._num_chunks(1720, 8000) == 2
    assert loss_fn._num_chunks(500, 8000) == 1
    assert loss_fn._num_chunks(16384, 128256) == 8  # a large vocabulary keeps the chunks asked for
    assert LinearCrossEntropyLoss(8, min_chunk_mib=0)._num_chunks(1720, 8000) == 8
    hidden, weight, labels = _data(seq=300, vocab=30000)  # 313 labelled tokens, 279 rows a chunk
    merged = _loss_and_grads(lambda h, w, y: loss_fn(h, y, output=w), hidden, weight, labels)
    eight = _loss_and_grads(
        lambda h, w, y: LinearCrossEntropyLoss(8, min_chunk_mib=0, reduction="sum")(h, y, output=w),
        hidden,
        weight,
        labels,
    )
    assert loss_fn._num_chunks(int((labels != IGNORE).sum()), 30000) == 2
    for g, w in zip(merged, eight):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="min_chunk_mib"):
        LinearCrossEntropyLoss(min_chunk_mib=-1)


def test_both_losses_average_by_default_like_torchtune():
    # torchtune's CEWithChunkedOutputLoss returns the mean over non-ignored tokens; a loop written for it
    # (loss * num_tokens) must see the same number here
    hidden, weight, labels = _data()
    want = F.cross_entropy((hidden @ weight.T).reshape(-1, 50), labels.reshape(-1), ignore_index=IGNORE)
    logits = hidden @ weight.T
    torch.testing.assert_close(CEWithChunkedOutputLoss(4)(list(logits.chunk(4, dim=1)), labels), want)
    torch.testing.assert_close(LinearCrossEntropyLoss(4)(hidden, labels, output=weight), want)
