"""tune.training.estimate_memory: each term against values computed by hand for tiny models.

Expected numbers come from the models themselves (``numel * element_size`` of a model built for real on CPU) or
from the formulas written out in each test; none is read back from the estimator.
"""

import pytest
import torch
from torch import nn

from tune import training
from tune.models.llama3_2 import llama3_2, lora_llama3_2
from tune.modules.peft import get_adapter_params
from tune.training._memory_estimate import layer_activation_bytes, optimizer_state_bytes, parameter_bytes

# a tiny Llama 3.2: dim 64, 2 layers, 4 heads, 2 kv heads, MLP 128, vocab 256
DIMS = dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=128,
            intermediate_dim=128)  # fmt: skip
LORA = dict(lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, lora_rank=4)


def _build(builder, dtype=torch.float32, device="meta", **kwargs):
    with training.set_default_dtype(dtype), torch.device(device):
        return builder(**DIMS, **kwargs)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_the_real_models_bytes(dtype):
    real = _build(llama3_2, dtype, device="cpu")
    expected = _bytes(real.parameters()) + _bytes(real.buffers())
    estimate = training.estimate_memory(_build(llama3_2, dtype), batch_size=1, seq_len=8, device_type="cuda")
    assert estimate.terms["weights"] == expected
    assert estimate.num_params == sum(p.numel() for p in real.parameters())


def test_full_finetuning_gradients_and_adamw_state():
    model = _build(llama3_2)
    params = _bytes(model.parameters())
    # with accumulation the gradients exist during the next forward: all of them are in the peak
    estimate = training.estimate_memory(model, batch_size=1, seq_len=8, gradient_accumulation_steps=2)
    assert estimate.terms["gradients"] == params
    assert estimate.terms["optimizer state"] == 2 * params  # AdamW: exp_avg and exp_avg_sq in the param dtype
    assert estimate.num_trainable == sum(p.numel() for p in model.parameters())


def test_optimizer_states_by_class():
    n = 1000
    assert optimizer_state_bytes("torch.optim.AdamW", n, 4) == 8000
    assert optimizer_state_bytes("torch.optim.AdamW", n, 2) == 4000  # torch keeps bf16 moments for bf16 params
    assert optimizer_state_bytes("torch.optim.AdamW", n, 4, amsgrad=True) == 12000
    assert optimizer_state_bytes("torch.optim.SGD", n, 4) == 0
    assert optimizer_state_bytes("torch.optim.SGD", n, 4, momentum=0.9) == 4000
    # 8-bit: one byte per state element plus one fp32 scale per 256-element block
    assert optimizer_state_bytes("torchao.optim.AdamW8bit", n, 2) == int(2 * n * (1 + 4 / 256))
    assert optimizer_state_bytes("bitsandbytes.optim.PagedAdamW8bit", n, 2) == int(2 * n * (1 + 4 / 256))


def test_optimizer_in_backward_keeps_one_gradient():
    model = _build(llama3_2)
    estimate = training.estimate_memory(model, batch_size=1, seq_len=8, optimizer_in_bwd=True)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    assert estimate.terms["gradients"] == largest


def test_lora_trains_only_the_adapters():
    model = _build(lora_llama3_2, **LORA)
    adapters = list(get_adapter_params(model).values())
    adapter_bytes = _bytes(adapters)
    estimate = training.estimate_memory(
        model, batch_size=1, seq_len=8, trainable="adapters", gradient_accumulation_steps=2
    )
    assert estimate.num_trainable == sum(p.numel() for p in adapters)
    assert estimate.terms["gradients"] == adapter_bytes
    assert estimate.terms["optimizer state"] == 2 * adapter_bytes
    assert estimate.terms["weights"] == _bytes(model.parameters()) + _bytes(model.buffers())


def test_nf4_weights_count_codes_and_scales():
    pytest.importorskip("torchao")
    real = _build(lora_llama3_2, device="cpu", quantize_base=True, **LORA)
    nf4 = [p for p in real.parameters() if type(p).__name__ == "NF4Tensor"]
    assert nf4, "QLoRA quantises the adapted layers' base weights"
    inner = 0
    for weight in nf4:  # the 4-bit codes, the int8 block scales and their fp32 factors, as torchao stores them
        names, _ = weight.__tensor_flatten__()
        inner += _bytes(getattr(weight, name) for name in names)
    dense = [p for p in real.parameters() if type(p).__name__ != "NF4Tensor"]
    expected = inner + _bytes(dense) + _bytes(real.buffers())
    assert parameter_bytes(_build(lora_llama3_2, quantize_base=True, **LORA), buffers=True) == expected
    # about half a byte per element: the codes (numel / 2), one int8 scale per block of 64, and per weight its
    # fp32 scale factors and 16-entry lookup table (a larger share on these tiny weights than on real ones)
    numel = sum(w.numel() for w in nf4)
    assert numel / 2 + numel / 64 < inner < 0.6 * numel


def test_sharding_divides_weights_gradients_and_optimizer_state():
    model = _build(llama3_2)
    one = training.estimate_memory(model, batch_size=1, seq_len=8, gradient_accumulation_steps=2)
    four = training.estimate_memory(model, batch_size=1, seq_len=8, gradient_accumulation_steps=2, world_size=4)
    for term in ("weights", "gradients", "optimizer state"):
        assert four.terms[term] == one.terms[term] // 4
    layer = _bytes(model.layers[0].parameters())
    assert four.terms["gathered layers (FSDP)"] == 2 * layer  # one layer gathered, the next prefetched
    offloaded = training.estimate_memory(model, batch_size=1, seq_len=8, world_size=4, fsdp_cpu_offload=True)
    assert "weights" not in offloaded.terms and offloaded.host["weights"] == one.terms["weights"] // 4


def test_parallel_dims_must_divide_the_world():
    with pytest.raises(ValueError, match="not a multiple"):
        training.estimate_memory(_build(llama3_2), batch_size=1, seq_len=8, world_size=3, tensor_parallel_dim=2)
    with pytest.raises(ValueError, match="no adapter parameters"):
        training.estimate_memory(_build(llama3_2), batch_size=1, seq_len=8, trainable="adapters")


def test_traced_activations_of_a_hand_made_layer():
    # Linear(d, f) saves its input [d]; ReLU saves its output [f], which is also Linear(f, d)'s saved input
    d, f = 16, 48
    with torch.device("meta"):
        layer = nn.Sequential(nn.Linear(d, f), nn.ReLU(), nn.Linear(f, d))
    per_token, per_token_squared = layer_activation_bytes(layer, d, torch.float32)
    assert per_token == (d + f) * 4
    assert per_token_squared == 0


def test_activations_scale_with_tokens_and_checkpointing_keeps_layer_inputs():
    model = _build(lora_llama3_2, **LORA)
    d, tokens, itemsize = DIMS["embed_dim"], 2 * 32, 4
    a, c = layer_activation_bytes(model.layers[0], d, torch.float32)
    assert c == 0  # SDPA as a fused kernel: nothing quadratic in the sequence
    kwargs = dict(batch_size=2, seq_len=32, trainable="adapters")
    plain = training.estimate_memory(model, **kwargs)
    final_norm = 2 * tokens * d * itemsize  # the final norm's input and output
    assert plain.terms["activations"] == int(2 * 32 * a * DIMS["num_layers"] + final_norm)
    checkpointed = training.estimate_memory(model, activation_checkpointing=True, **kwargs)
    # every layer keeps its input; backward recomputes one layer at a time
    expected = DIMS["num_layers"] * tokens * d * itemsize + 2 * 32 * a + final_norm
    assert checkpointed.terms["activations"] == int(expected)
    # context parallelism splits each sequence over its ranks
    split = training.estimate_memory(model, world_size=2, context_parallel_dim=2, **kwargs)
    assert split.tokens_per_device == tokens // 2


def test_loss_buffers():
    model = _build(llama3_2)
    d, vocab, tokens = DIMS["embed_dim"], DIMS["vocab_size"], 4 * 16
    linear = training.estimate_memory(model, batch_size=4, seq_len=16, loss="linear", trainable="all")
    # vocab 256 -> chunks of up to 32 MiB of fp32 logits hold every token: one chunk of logits and its gradient,
    # plus the hidden states' gradient made during forward
    assert linear.terms["loss and logits"] == 2 * tokens * vocab * 4 + tokens * d * 4
    full = training.estimate_memory(model, batch_size=4, seq_len=16, loss="full")
    assert full.terms["loss and logits"] == tokens * vocab * (4 + 4 + 4)  # fp32 logits, log-softmax, its gradient
    # bf16: the chunk's logits in bf16 besides the fp32 log-softmax and gradient
    bf16 = training.estimate_memory(_build(llama3_2, torch.bfloat16), batch_size=4, seq_len=16, trainable="all")
    assert bf16.terms["loss and logits"] == tokens * vocab * (2 + 4 + 4) + tokens * d * 2
    # with checkpointing, a chunk of logits (forward) and a recomputed layer (backward) never coexist
    checkpointed = training.estimate_memory(
        model, batch_size=4, seq_len=16, activation_checkpointing=True, gradient_accumulation_steps=2
    )
    a, _ = layer_activation_bytes(model.layers[0], d, torch.float32)
    recompute = 4 * 16 * a
    assert checkpointed.terms["loss and logits"] == tokens * d * 4 + max(0, 2 * tokens * vocab * 4 - recompute)


def test_a_tied_output_gradient_meets_the_embeddings_after_backward():
    # Llama 3.2 ties the output projection to the embedding: the gradient LinearCrossEntropyLoss makes in forward
    # is summed with the embedding's own at the end of backward, so both exist for a moment
    model = _build(llama3_2)
    assert model.output.weight is model.tok_embeddings.weight
    estimate = training.estimate_memory(model, batch_size=1, seq_len=4)
    embedding = model.tok_embeddings.weight
    assert estimate.phase == "after backward"
    assert estimate.terms["gradients"] == _bytes(model.parameters()) + embedding.numel() * embedding.element_size()


def test_frozen_models_hold_their_weights():
    model = _build(llama3_2)
    reference = training.FrozenModel("reference", _build(llama3_2), num_sequences=2, seq_len=16)
    estimate = training.estimate_memory(model, batch_size=1, seq_len=16, frozen_models=[reference])
    assert estimate.terms["frozen models"] == _bytes(model.parameters()) + _bytes(model.buffers())
    assert estimate.terms["frozen models' forward"] > 0


def test_peak_and_fit():
    model = _build(llama3_2)
    estimate = training.estimate_memory(model, batch_size=1, seq_len=8, baseline_bytes=100, device_memory=10**9)
    assert estimate.peak == sum(estimate.terms.values())
    assert estimate.terms["baseline"] == 100 and estimate.fits is True
    tight = training.estimate_memory(model, batch_size=1, seq_len=8, device_memory=1000)
    assert tight.fits is False and tight.as_dict()["fits"] is False
    # on CPU the checkpoint's state dict and two converted copies sit next to the model while it loads
    cpu = training.estimate_memory(model, batch_size=1, seq_len=8, device_type="cpu")
    assert cpu.load_peak == cpu.terms["weights"] + 3 * _bytes(model.parameters())
    # and its resident set carries the allocator's share of what the layers save (benchmarks/bench_estimate.py)
    a, c = layer_activation_bytes(model.layers[0], DIMS["embed_dim"], torch.float32)
    expected = int(training.CPU_ALLOCATOR_OVERHEAD * DIMS["num_layers"] * (a * 8 + c * 64))
    assert cpu.terms["allocator overhead (CPU)"] == expected
    assert "allocator overhead (CPU)" not in estimate.terms
