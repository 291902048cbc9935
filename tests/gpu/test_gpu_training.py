"""The GPU tier: what only a CUDA device can show. Skipped where there is none (tests/conftest.py).

    pytest -m gpu tests/gpu -n 4       # on a machine with one NVIDIA GPU (float8 needs compute capability 8.9+)
    TUNE_GPU_TIER_DEVICE=cpu pytest -m gpu tests/gpu -n 2    # dry run: the GPU side on the CPU (tests/gpu/_checks.py)

Each test runs a recipe on the tiny Llama of tests/recipes (tests/recipes/utils.py builds it in code) or a small
tune model, for a few steps, and compares against a second run that differs in one setting: bf16 against fp32
within bf16's precision, inductor against eager, offloaded activations against resident ones, FSDP2 mixed
precision and CPU offload (one process, NCCL) against plain FSDP2, float8 matmuls and NF4 base weights against
their high-precision runs. They need about 2 GiB of GPU memory and a minute or two in all.
"""

import contextlib
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.gpu._checks import DEVICE, ON_CPU, check_close, check_losses, compare, record, skip_on_cpu
from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import (
    ASSETS,
    build_tiny_assets,
    loss_records,
    losses_by_step,
    run_recipe,
)

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

FULL, LORA = "full_finetune_single_device", "lora_finetune_single_device"
FULL_CONFIG, LORA_CONFIG = ASSETS / "full_tiny.yaml", ASSETS / "lora_tiny.yaml"
# bf16 keeps 8 significant bits: a value it stores is off by up to 2^-8 relative (see the CPU bf16 test in
# tests/recipes/test_full_finetune_single_device.py: step N's loss may differ from fp32's by about N * 2^-8)
BF16_REL = 2**-8


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu_assets")
    return build_tiny_assets(root)


def _run(assets: Path, out: Path, *extra: str, recipe: str = FULL, config: Path = FULL_CONFIG, env=None):
    overrides = [f"assets_dir={assets}", f"output_dir={out}", f"device={DEVICE}", "log_every_n_steps=1", *extra]
    return run_recipe(recipe, config, overrides, cwd=out.parent, timeout=300, env=env)


def _run_fsdp(assets: Path, out: Path, *extra: str):
    overrides = [f"assets_dir={assets}", f"output_dir={out}", "device=cuda", "log_every_n_steps=1", *extra]
    return run_distributed("full_finetune_distributed", FULL_CONFIG, overrides, cwd=out.parent, nproc=1)


def test_bf16_training_tracks_fp32(assets, tmp_path):
    _run(assets, tmp_path / "fp32", "dtype=fp32")
    _run(assets, tmp_path / "bf16", "dtype=bf16")
    fp32, bf16 = losses_by_step(tmp_path / "fp32"), losses_by_step(tmp_path / "bf16")
    assert sorted(fp32) == [1, 2, 3]
    check_losses(f"full: bf16 vs fp32 on {DEVICE} (AdamW), loss per step", bf16, fp32, BF16_REL)
    assert bf16 != fp32  # the run did compute in bf16


# Comparisons of two numerically different runs past step 1 use SGD, whose update is linear in the gradient: AdamW's
# first step moves every parameter by about lr * sign(grad), so gradient entries at rounding-noise level flip their
# update between runs. What SGD showed on an H100 (torch 2.11): inductor's losses left eager's at step 2 by 1.7e-2
# because torch 2.11's dynamo dropped the weight gradient of RMSNorm's autograd Function (fixed: compiled code
# runs the composed ops; gradients then agree within 7e-7 relative). On an H200 the same happened to compiled LoRA
# (2.4e-2, fixed the same way). fp32 LoRA on CUDA vs the CPU parted by 6e-4 at step 2 (step 1 equal) until both
# runs started from one saved adapter: fresh adapters come from each device's generator (test_fp32_on_cuda_matches_cpu)
SGD = "optimizer._component_=torch.optim.SGD"


def test_inductor_compile_matches_eager(assets, tmp_path):
    env_inductor = {"TORCH_COMPILE_BACKEND": "inductor"}  # the default; set in case the caller's env has another
    _run(assets, tmp_path / "eager", SGD)
    _run(assets, tmp_path / "inductor", SGD, "compile=True", env=env_inductor)
    eager, compiled = losses_by_step(tmp_path / "eager"), losses_by_step(tmp_path / "inductor")
    assert sorted(eager) == [1, 2, 3]
    # fp32 throughout; inductor fuses and reorders reductions: float32 rounding over a 320-way log-softmax and
    # a few SGD steps stays far below 1e-4
    check_close(f"full: compile vs eager on {DEVICE}, fp32 SGD, losses", _values(compiled), _values(eager), abs=1e-4)


def test_inductor_compile_matches_eager_with_lora(assets, tmp_path):
    env_inductor = {"TORCH_COMPILE_BACKEND": "inductor"}
    _run(assets, tmp_path / "eager", SGD, recipe=LORA, config=LORA_CONFIG)
    _run(assets, tmp_path / "inductor", SGD, "compile=True", recipe=LORA, config=LORA_CONFIG, env=env_inductor)
    eager, compiled = losses_by_step(tmp_path / "eager"), losses_by_step(tmp_path / "inductor")
    assert sorted(eager) == [1, 2, 3]
    assert eager[3] != eager[1]  # SGD at the LoRA config's lr trains
    # as for full fine-tuning: fp32, reordered reductions, a frozen base and a rank-8 adapter per layer
    check_close(f"lora: compile vs eager on {DEVICE}, fp32 SGD, losses", _values(compiled), _values(eager), abs=1e-4)


def _values(losses: dict[int, float]) -> list[float]:
    return [losses[step] for step in (1, 2, 3)]


def test_activation_offloading_keeps_the_losses_in_the_recipe(assets, tmp_path):
    skip_on_cpu("activation offloading moves saved tensors from the GPU to host memory; on the CPU it is ignored")
    _run(assets, tmp_path / "plain")
    proc = _run(assets, tmp_path / "offload", "enable_activation_offloading=True")
    assert "is ignored" not in proc.stderr
    plain, offload = losses_by_step(tmp_path / "plain"), losses_by_step(tmp_path / "offload")
    # the same kernels on the same values: only where the saved tensors wait differs
    check_close("full: offloaded vs resident activations, losses", _values(offload), _values(plain), abs=1e-6)


def test_activation_offloading_keeps_gradients_and_lowers_peak_memory():
    from tune.models.llama2 import llama2
    from tune.training import OffloadActivations

    skip_on_cpu("measures CUDA peak memory")
    device = torch.device("cuda")
    torch.manual_seed(0)
    # 4 layers of dim 256 (~4M parameters, 16 MiB) on 8 x 512 tokens: saved activations (hundreds of MiB)
    # dominate the peak, which is what offloading moves to host memory
    model = llama2(
        vocab_size=320, num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=256, max_seq_len=512, intermediate_dim=512
    ).to(device)
    tokens = torch.randint(3, 320, (8, 512), device=device)

    def step(offload: bool) -> tuple[float, float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with OffloadActivations() if offload else contextlib.nullcontext():
            logits = model(tokens)  # [b, s, vocab]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.cuda.synchronize()
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        return loss.item(), torch.cuda.max_memory_allocated(), grads

    plain_loss, plain_peak, plain_grads = step(offload=False)
    offload_loss, offload_peak, offload_grads = step(offload=True)
    assert offload_loss == plain_loss
    for name, grad in plain_grads.items():
        torch.testing.assert_close(offload_grads[name], grad, msg=name)  # float32 tolerance: atomics may reorder
    print(f"peak memory: {plain_peak / 2**20:.0f} MiB plain, {offload_peak / 2**20:.0f} MiB offloaded")
    assert offload_peak < 0.8 * plain_peak


def test_fsdp2_bf16_mixed_precision_tracks_fp32(assets, tmp_path):
    skip_on_cpu("FSDP2 on one CUDA rank (NCCL)")
    _run_fsdp(assets, tmp_path / "fp32")
    _run_fsdp(assets, tmp_path / "mixed", "fsdp_mixed_precision={param_dtype: bf16, reduce_dtype: fp32}")
    fp32, mixed = losses_by_step(tmp_path / "fp32"), losses_by_step(tmp_path / "mixed")
    assert sorted(fp32) == [1, 2, 3]
    # the forward and backward run on bf16 copies of fp32 master weights: each step's loss is within bf16's
    # precision of the fp32 run's (updates are applied in fp32, so the error does not compound as with dtype=bf16)
    check_losses("fsdp2: bf16 mixed precision vs fp32, loss per step", mixed, fp32, BF16_REL)
    assert mixed != fp32


def test_fsdp2_cpu_offload_keeps_the_losses(assets, tmp_path):
    skip_on_cpu("FSDP2 on one CUDA rank (NCCL)")
    _run_fsdp(assets, tmp_path / "resident")
    _run_fsdp(assets, tmp_path / "offload", "fsdp_cpu_offload=True")
    resident, offload = losses_by_step(tmp_path / "resident"), losses_by_step(tmp_path / "offload")
    # the optimizer steps on CPU in fp32 instead of on the GPU: float32 rounding only
    check_close("fsdp2: cpu offload vs resident, losses", _values(offload), _values(resident), abs=1e-5)


def test_float8_training_stays_close_to_bf16(assets, tmp_path):
    skip_on_cpu("float8 matmuls need a CUDA GPU of compute capability 8.9+")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need compute capability 8.9+ (Ada, Hopper, Blackwell)")
    converter = "model_converters=[{_component_: tune.training.Float8TrainingConverter}]"
    _run(assets, tmp_path / "bf16", "dtype=bf16")
    _run(assets, tmp_path / "float8", "dtype=bf16", converter)
    bf16, float8 = losses_by_step(tmp_path / "bf16"), losses_by_step(tmp_path / "float8")
    # e4m3 keeps 4 significant bits (2^-4 relative per value, with per-tensor scales); the tiny model's dims
    # (64, 128, 256) are multiples of 16 as float8 matmuls need; the output projection stays in bf16 (the default)
    check_close("full: float8 vs bf16, losses", _values(float8), _values(bf16), rel=2**-4)
    assert float8 != bf16


@pytest.mark.parametrize("kind", ["qlora", "lora", "full"])
def test_fp32_on_cuda_matches_cpu(assets, tmp_path, kind):
    """fp32 LoRA with and without an NF4 base, and full fine-tuning, CUDA against the CPU: the plain LoRA run tells
    whether a difference comes from NF4, the full run whether it comes from LoRA at all, or from the paths the two
    devices take (padding-free rows: flex attention on CUDA, split attention on the CPU)."""
    skip_on_cpu("compares CUDA with the CPU")
    recipe, config = (FULL, FULL_CONFIG) if kind == "full" else (LORA, LORA_CONFIG)
    # a clip far above the tiny model's gradient norm: never applied, but the norm is logged
    extra = [SGD, "clip_grad_norm=1000"]
    if kind != "full":
        # Both runs start from one saved adapter. Fresh adapters would differ: the recipe builds the model on its
        # device, and lora_a's Kaiming draw comes from that device's generator (as in torchtune, whose seeds
        # therefore give tune's adapters on either device); a CUDA run and a CPU run with one seed start from
        # different A matrices, which an H200 run showed as grad norms 7% apart at step 1.
        adapter = _random_adapter(tmp_path / "adapter")
        extra += [f"model.quantize_base={kind == 'qlora'}", f"checkpointer.adapter_checkpoint={adapter}"]
    _run(assets, tmp_path / "cuda", *extra, recipe=recipe, config=config)
    overrides = [f"assets_dir={assets}", f"output_dir={tmp_path / 'cpu'}", "log_every_n_steps=1", *extra]
    run_recipe(recipe, config, overrides, cwd=tmp_path, timeout=300)
    on_cuda, on_cpu = losses_by_step(tmp_path / "cuda"), losses_by_step(tmp_path / "cpu")
    assert sorted(on_cuda) == [1, 2, 3]
    # NF4 quantisation is deterministic (nearest of 16 levels per value, absmax scales): both devices hold the
    # same base weights, and the fp32 computation around them differs by float32 rounding
    assert on_cuda[3] != on_cuda[1]  # SGD at the config's lr still trains
    # tests/gpu/test_gpu_kernels.py::test_nf4_on_device_matches_cpu checks the NF4 layer alone,
    # test_lora_gradients_on_device_match_cpu below each adapter's gradient
    name = {"qlora": "qlora fp32: nf4", "lora": "lora fp32:", "full": "full fp32:"}[kind]
    # recorded, not asserted: which step's gradient parts first (the losses of step N show step N-1's update)
    norms = [{r["step"]: r["grad_norm"] for r in loss_records(tmp_path / d)} for d in ("cuda", "cpu")]
    compare(f"{name} on cuda vs cpu, grad norms", _values(norms[0]), _values(norms[1]), abs=1e-5)
    check_close(f"{name} on cuda vs cpu, losses", _values(on_cuda), _values(on_cpu), abs=1e-4)


def _tiny_lora_model() -> torch.nn.Module:
    """The model lora_tiny.yaml builds (tests/recipes/assets), randomly initialised."""
    from tune.models.llama2 import lora_llama2

    return lora_llama2(
        ["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, lora_rank=8, lora_alpha=16,
        vocab_size=320, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=128, intermediate_dim=256,
        max_seq_len=512,
    )  # fmt: skip


def _random_adapter(directory: Path) -> Path:
    """lora_tiny.yaml's adapters with random A and B (seeded), in tune's keys: what a recipe saves, without PEFT
    (whose torchao check refuses the torchao the GPU machine gets for torchtune 0.6.1)."""
    from safetensors.torch import save_file

    torch.manual_seed(3)
    model = _tiny_lora_model()
    adapter = {name: torch.randn_like(p) * 0.05 for name, p in model.named_parameters() if "lora_" in name}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(adapter, directory / "adapter_model.safetensors")
    return directory


def _lora_gradients(model, loss_fn, batch: dict, device: str) -> dict[str, torch.Tensor]:
    from tune.modules.loss import shift_labels

    model.zero_grad(set_to_none=True)
    batch = {k: v.to(device) for k, v in batch.items()}
    outputs = model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
    loss_fn(outputs, shift_labels(batch["labels"])).backward()
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("collate", ["padding_free", "padded"])
def test_lora_gradients_on_device_match_cpu(collate):
    """One fp32 LoRA backward of the tiny recipe model, every trainable parameter's gradient on the device against
    the CPU, with the adapters already trained (B nonzero: the state of step 2, where the recipe runs part).

    The device runs each of its own paths (flex or dense attention for the padding-free row, the fused or the
    written LoRA), so a difference is pinned to a path and a parameter."""
    from tune.data import padded_collate_sft, padding_free_collate
    from tune.modules.loss import LinearCrossEntropyLoss
    from tune.modules.peft import LoRALinear, set_trainable_params

    record(
        f"float32 matmul precision on {DEVICE}: {torch.get_float32_matmul_precision()}, "
        f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}",
        0.0,
        0.0,
        "highest, False",
        torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32,
    )
    torch.manual_seed(0)
    model = _tiny_lora_model()
    set_trainable_params(model, {n for n, p in model.named_parameters() if "lora_" in n})
    with torch.no_grad():  # adapters a step or more into training
        for name, p in model.named_parameters():
            if "lora_b" in name:
                p.normal_(0.0, 0.02)
    lengths, prompt = [37, 60, 25, 80], 9
    samples = []
    for length in lengths:
        tokens = torch.randint(3, 320, (length,))
        labels = tokens.clone()
        labels[:prompt] = -100
        samples.append({"tokens": tokens.tolist(), "labels": labels.tolist()})
    batch = padding_free_collate(samples) if collate == "padding_free" else padded_collate_sft(samples)
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=4)
    loss_fn.set_model_output(model)
    reference = _lora_gradients(model, loss_fn, batch, "cpu")
    assert reference and all("lora_" in name for name in reference)

    on_device = copy.deepcopy(model).to(DEVICE)
    device_loss = LinearCrossEntropyLoss(num_output_chunks=4)
    device_loss.set_model_output(on_device)
    lora_layers = [m for m in on_device.modules() if isinstance(m, LoRALinear)]
    variants = {"default": {}}
    if collate == "padding_free" and not ON_CPU:
        variants["dense sdpa"] = {"flex": False}
    variants["written lora"] = {"fast": False}
    variants["all tokens projected"] = {"mask": False}
    failures = []
    for variant, change in variants.items():
        on_device.use_flex_attention = change.get("flex", True)
        for layer in lora_layers:
            layer.use_fast_path = change.get("fast", True)
        device_loss.mask_ignored_tokens = change.get("mask")
        grads = _lora_gradients(on_device, device_loss, batch, DEVICE)
        for name, expected in reference.items():
            # a gradient here sums a few hundred float32 products per entry: rounding stays near 1e-6 of the
            # parameter's largest gradient entry
            scale = expected.abs().max().item()
            tolerance = dict(rel=1e-5, abs=1e-5 * scale, tolerance=f"rel=1e-5, abs=1e-5 * max|reference| ({scale:.3g})")
            compared = f"lora fp32 {collate}, {variant} on {DEVICE} vs cpu: grad {name}"
            failures.append(compare(compared, grads[name], expected, **tolerance))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures[:12]) + f"\n({len(failures)} in all)"
