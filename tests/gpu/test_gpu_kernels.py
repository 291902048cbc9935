"""Kernels the GPU runs differently from the CPU, checked one module at a time on the tier's device.

- MoE experts: ``torch._grouped_mm`` (one call, no host sync) against the loop over experts, forward and backward.
- NF4 (QLoRA base weights): torchao's quantisation on the device against the CPU's, payload bit for bit, then the
  dequantised weight, then tune's ``LoRALinear(quantize_base=True)`` forward, backward and one SGD step.
- Packed batches: flex attention against the dense masked SDPA call; a packed LoRA step without host syncs.
- Sampling with the KV cache: the same tokens and logits as recomputing the sequence, without cuDNN attention.
"""

import copy
import traceback

import pytest
import torch

from tests.gpu._checks import DEVICE, compare, record, skip_on_cpu

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# float32: the two paths multiply the same numbers, blocked and summed in another order (sums of up to 128
# products): a few float32 epsilons (1.2e-7) times the number of terms
FP32_TOLERANCE = dict(rel=1e-5, abs=1e-5)
# bf16: both paths accumulate in float32 and round each product to bf16 (2^-8 relative); a rounding that goes the
# other way (one unit) passes through silu * up and the down projection: 4 units, 2^-6, of the largest value
BF16_REL = 2**-6


def _tolerance(dtype: torch.dtype, expected: torch.Tensor) -> dict:
    if dtype == torch.float32:
        # a sum of K products rounds by about sqrt(K) epsilons of its largest terms: against the reference's
        # largest value, 16 epsilons (2e-6) covers K up to 256, plus FP32_TOLERANCE for values near 0
        scale = expected.detach().abs().max().item()
        abs_tol = FP32_TOLERANCE["abs"] + 16 * torch.finfo(torch.float32).eps * scale
        return dict(rel=FP32_TOLERANCE["rel"], abs=abs_tol, tolerance=f"rel=1e-5, abs=1e-5 + 16 eps * {scale:.3g}")
    scale = expected.detach().abs().max().item()
    return dict(rel=BF16_REL, abs=BF16_REL * scale, tolerance=f"rel=2^-6, abs=2^-6 * max|reference| ({scale:.3g})")


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_moe_grouped_mm_matches_the_loop(dtype_name):
    from tune.modules.moe import SwiGLUExperts

    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    num_tokens, dim, hidden_dim, num_experts, k = 64, 64, 128, 8, 2
    loop = SwiGLUExperts(dim, hidden_dim, num_experts).to(device=DEVICE, dtype=dtype)
    grouped = copy.deepcopy(loop)
    grouped.use_grouped_mm = True
    x = torch.randn(num_tokens, dim, device=DEVICE, dtype=dtype)
    router_logits = torch.randn(num_tokens, num_experts, device=DEVICE)
    router_logits[:, -1] = -float("inf")  # the last expert gets no token: an empty group on both paths
    weights, indices = router_logits.softmax(dim=-1).topk(k, dim=-1)  # [num_tokens, k], float32 as the router's
    grad_output = torch.randn(num_tokens, dim, device=DEVICE, dtype=dtype)

    def forward_backward(experts):
        inputs, mixing = x.clone().requires_grad_(), weights.clone().requires_grad_()
        out = experts(inputs, mixing, indices)
        out.backward(grad_output)
        grads = {f"grad {name}": p.grad for name, p in experts.named_parameters()}
        return {"output": out, "grad x": inputs.grad, "grad router weights": mixing.grad, **grads}

    on_loop, on_grouped = forward_backward(loop), forward_backward(grouped)
    failures = []
    for name, expected in on_loop.items():
        compared = f"moe {dtype_name} on {DEVICE}: {name}, grouped_mm vs loop"
        failures.append(compare(compared, on_grouped[name], expected, **_tolerance(dtype, expected)))
    assert not any(failures), [f for f in failures if f]


def _payload(weight) -> dict[str, torch.Tensor]:
    return {
        "quantized_data": weight.quantized_data,  # uint8: two 4-bit level indices per byte
        "quantized_scalers": weight.quantized_scalers,  # int8: each block's absmax, minus the mean, quantised
        "quantization_factor": weight.quantization_factor,  # per group of block scales
        "scaler_mean": weight.scaler_mean,  # the mean of the block absmaxes (a reduction)
    }


# What to expect (torchao's NF4Tensor.from_tensor, 0.15 and 0.18 alike): block absmaxes, the division by them and
# the nearest of the 16 levels are elementwise or exact, so the 4-bit indices should agree bit for bit. The
# scales' mean is a reduction whose order differs between devices: it may differ in its last bits, and so may
# the quantisation factor; a block scale that lies within that of a rounding boundary then flips by one int8 step.
# The dequantised weight then agrees to float32 rounding except in such blocks.
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_nf4_on_device_matches_cpu(dtype_name):
    from tune.modules.peft import LoRALinear, dequantize, to_nf4
    from tune.training import set_default_dtype

    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    # the tiny Llama's MLP shape and init (tests/recipes/utils.py), the block sizes tune's recipes pick for it
    dense = (0.08 * torch.randn(256, 128)).to(dtype)
    on_cpu, on_device = to_nf4(dense), to_nf4(dense.to(DEVICE))
    failures = []
    for name, expected in _payload(on_cpu).items():
        actual = _payload(on_device)[name]
        compared = f"nf4 {dtype_name}: {name}, {DEVICE} vs cpu"
        if name in ("scaler_mean", "quantization_factor"):  # a reduction's rounding: 4 units of the last place
            rel = 4 * torch.finfo(dtype).eps
            failures.append(compare(compared, actual, expected, rel=rel, tolerance=f"rel={rel:.3g} (4 eps)"))
        else:  # integers: bit for bit
            failures.append(compare(compared, actual.to(torch.int64), expected.to(torch.int64), tolerance="equal"))
    weight_cpu, weight_device = dequantize(on_cpu), dequantize(on_device)
    compared = f"nf4 {dtype_name}: dequantised weight, {DEVICE} vs cpu"
    # level * (scaler / factor + mean): a few roundings of the last place
    rel = 4 * torch.finfo(dtype).eps
    failures.append(compare(compared, weight_device, weight_cpu, rel=rel, tolerance=f"rel={rel:.3g} (4 eps)"))

    # tune's QLoRA layer built on each device, loading the same dense weight (quantised on load, as in the recipes),
    # through its fast path (a hand-written backward) and its written formula; the CPU's written formula is the
    # reference
    lora_a, lora_b = 0.1 * torch.randn(8, 128), 0.1 * torch.randn(256, 8)  # B != 0: both adapter grads are nonzero
    state = {"weight": dense, "lora_a.weight": lora_a.to(dtype), "lora_b.weight": lora_b.to(dtype)}
    x, grad_output = torch.randn(4, 16, 128).to(dtype), torch.randn(4, 16, 256).to(dtype)
    results = {}
    for device, fast in (("cpu", False), ("cpu", True), (DEVICE, False), (DEVICE, True)):
        with torch.device(device), set_default_dtype(dtype):
            layer = LoRALinear(128, 256, rank=8, alpha=16.0, quantize_base=True)
        layer.use_fast_path = fast
        layer.load_state_dict(state)
        inputs = x.detach().to(device, copy=True).requires_grad_()  # a leaf of its own on every device
        out = layer(inputs)
        out.backward(grad_output.to(device))
        step = {"output": out, "grad x": inputs.grad}
        step |= {f"grad {name}": p.grad for name, p in layer.named_parameters() if p.requires_grad}
        with torch.no_grad():  # one SGD step on the adapter, then the forward again: the recipe's step 2
            for p in layer.parameters():
                if p.requires_grad and p.grad is not None:
                    p -= 1e-3 * p.grad
            step["output after an SGD step"] = layer(x.to(device))
        results[(device, fast)] = step
    reference = results[("cpu", False)]
    for (device, fast), step in results.items():
        if (device, fast) == ("cpu", False):
            continue
        path = "fast path" if fast else "written formula"
        for name, expected in reference.items():
            compared = f"nf4 LoRALinear {dtype_name}: {name}, {device} {path} vs cpu written formula"
            if step[name] is None:
                record(compared, float("nan"), float("nan"), "a gradient", False)
                failures.append(f"{compared}: no gradient")
                continue
            failures.append(compare(compared, step[name], expected, **_tolerance(dtype, expected)))
    assert not any(failures), [f for f in failures if f]


def _packed_mask(batch_size: int, seq_len: int, lengths: list[list[int]]) -> torch.Tensor:
    """The block-causal [b, s, s] mask of packed rows holding documents of ``lengths`` (each row sums to s)."""
    mask = torch.zeros(batch_size, seq_len, seq_len, dtype=torch.bool)
    for row, documents in enumerate(lengths):
        start = 0
        for length in documents:
            mask[row, start : start + length, start : start + length] = torch.ones(length, length).tril().bool()
            start += length
    return mask


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_packed_decoder_flex_attention_matches_dense_sdpa(dtype_name):
    """A packed batch through a small Llama: flex attention (the GPU default) against the dense masked SDPA call."""
    from tune.models.llama3_1 import llama3_1

    skip_on_cpu("flex attention has no backward on CPU, and the decoder uses it on CUDA only")
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    flex = llama3_1(
        vocab_size=512, num_layers=2, num_heads=8, num_kv_heads=2, embed_dim=256, max_seq_len=512, intermediate_dim=512
    ).to(device=DEVICE, dtype=dtype)
    dense = copy.deepcopy(flex)
    dense.use_flex_attention = False
    tokens = torch.randint(0, 512, (2, 384), device=DEVICE)
    mask = _packed_mask(2, 384, [[100, 200, 84], [384]]).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in (100, 200, 84, 384)]).view(2, 384).to(DEVICE)

    def forward_backward(model):
        logits = model(tokens, mask=mask, input_pos=positions)
        logits.float().logsumexp(-1).mean().backward()
        grads = {f"grad {name}": p.grad for name, p in model.named_parameters() if "layers.0." in name}
        return {"logits": logits, **grads}

    on_flex, on_dense = forward_backward(flex), forward_backward(dense)
    failures = []
    for name, expected in on_dense.items():
        compared = f"packed decoder {dtype_name} on {DEVICE}: {name}, flex vs dense SDPA"
        tolerance = _tolerance(dtype, expected)
        if dtype == torch.float32:  # two attention kernels, each blocking its softmax differently, in two layers
            scale = expected.detach().abs().max().item()
            tolerance = dict(rel=1e-4, abs=1e-4 * scale, tolerance=f"rel=1e-4, abs=1e-4 * max|reference| ({scale:.3g})")
        failures.append(compare(compared, on_flex[name], expected, **tolerance))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_step_has_no_host_device_sync(compiled):
    """A packed training step as the SFT recipes run it on a GPU (flex attention, fused linear cross-entropy, fused
    AdamW) under CUDA's sync debug mode: the first synchronisation the step forces is
    recorded, and there must be none."""
    from tune.models.llama3_1 import lora_llama3_1
    from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
    from tune.modules.peft import set_trainable_params
    from tune.training import compile_loss, compile_model

    skip_on_cpu("CUDA's sync debug mode")
    torch.manual_seed(0)
    model = lora_llama3_1(
        ["q_proj", "v_proj", "output_proj"],
        apply_lora_to_mlp=True,
        vocab_size=512,
        num_layers=2,
        num_heads=8,
        num_kv_heads=2,
        embed_dim=256,
        max_seq_len=512,
        intermediate_dim=512,
    ).to(device=DEVICE, dtype=torch.bfloat16)
    set_trainable_params(model, {n for n, p in model.named_parameters() if "lora_" in n})
    loss_fn = LinearCrossEntropyLoss(reduction="sum")
    loss_fn.set_model_output(model)
    if compiled:
        compile_model(model, verbose=False)
        compile_loss(loss_fn, verbose=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    tokens = torch.randint(0, 512, (2, 384), device=DEVICE)
    labels = tokens.clone()
    labels[:, :10] = -100
    mask = _packed_mask(2, 384, [[100, 200, 84], [384]]).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in (100, 200, 84, 384)]).view(2, 384).to(DEVICE)

    def step():
        loss = loss_fn(model(tokens, mask=mask, input_pos=positions), shift_labels(labels))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(2):  # compilation and the allocator's first pass synchronise; the steady state is what counts
        step()
    torch.cuda.synchronize()
    where = None  # the frames that forced the first synchronisation, if any
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as error:
        if "synchroniz" not in str(error):
            raise
        frames = traceback.extract_tb(error.__traceback__)[-8:]
        where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(frames))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    mode = "compiled" if compiled else "eager"
    record(
        f"host-device syncs in one packed LoRA step ({mode}): {where or 'none'}",
        float(bool(where)),
        0.0,
        "none",
        where is None,
    )
    assert where is None, where


def test_cached_decoding_matches_recomputation_without_cudnn_attention():
    """Sampling with the KV cache on the device: greedy tokens and logits as recomputing the whole sequence gives
    them, and no cuDNN attention call in the decode steps. cuDNN plans its kernel per shape on the host, and a
    cached step's keys grow by one every token: on an H200 that cost 2.5 ms per layer and token, four times the
    rest of a 1B model's decode step (tune.modules._attention picks the other SDPA backends there)."""
    from torch.profiler import ProfilerActivity, profile

    from tune import generation
    from tune.models.llama3_1 import llama3_1

    torch.manual_seed(0)
    model = llama3_1(
        vocab_size=512, num_layers=2, num_heads=8, num_kv_heads=2, embed_dim=256, max_seq_len=512, intermediate_dim=512
    ).to(DEVICE)
    model.eval()
    prompts = [torch.randint(1, 512, (n,)).tolist() for n in (7, 12, 3, 12)]
    kwargs = dict(max_generated_tokens=12, pad_id=0, temperature=0.0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        cached, cached_logits = generation.generate(model, prompts, **kwargs)
    recomputed, recomputed_logits = generation.generate(model, prompts, use_cache=False, **kwargs)
    cudnn_calls = sum(e.count for e in prof.key_averages() if "cudnn_attention" in e.key)
    record(
        f"cuDNN attention calls while sampling 12 tokens with the KV cache on {DEVICE}",
        cudnn_calls,
        0.0,
        "0",
        not cudnn_calls,
    )
    failure = compare(
        f"greedy sampling fp32 on {DEVICE}: logits with the KV cache vs recomputed", cached_logits, recomputed_logits,
        **FP32_TOLERANCE,
    )  # fmt: skip
    assert failure is None, failure
    assert torch.equal(cached, recomputed)
    assert cudnn_calls == 0
