"""Tests of tune/training/_model_converters.py and recipes/quantize.py.

The QAT tests train one tiny Llama (module-scoped fixture) with fake quantisation on a synthetic next-token
task, quantise it for real with torchao, and compare: the int8/int4 model must compute what the fake-quantised
model computed (the fake quantisation simulates exactly the rounding the real kernels apply), so accuracy and
loss are unchanged by the conversion.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from tune.models.llama3_2 import llama3_2, lora_llama3_2
from tune.modules.peft import LoRALinear
from tune.training import (
    FakeQuantizedLoRALinear,
    Float8TrainingConverter,
    Int8DynActInt4WeightQATConverter,
    QATConverter,
    apply_model_converters,
    register_post_optimizer_hooks,
    validate_converter_order,
)

ROOT = Path(__file__).resolve().parents[3]
VOCAB = 64
# every linear layer's input size (32, 64) is a multiple of the groupsize 32, so all of them are quantised
TINY = dict(
    vocab_size=VOCAB,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    embed_dim=32,
    max_seq_len=32,
    intermediate_dim=64,
    tie_word_embeddings=False,
)


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return llama3_2(**TINY)


def _batch(generator: torch.Generator, num: int = 16, seq_len: int = 12) -> torch.Tensor:
    # a deterministic bigram rule: token[t+1] = (5 * token[t] + 3) mod 64, from a random first token
    tokens = torch.empty(num, seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (num,), generator=generator)
    for t in range(1, seq_len):
        tokens[:, t] = (5 * tokens[:, t - 1] + 3) % VOCAB
    return tokens


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _accuracy(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return (logits[:, :-1].argmax(-1) == tokens[:, 1:]).float().mean().item()


class _Recorder:
    """A converter that records the order it ran in."""

    def __init__(self, name: str, log: list, kind: str | None = None, must_precede=(), conflicts_with=()):
        self.name, self.log = name, log
        if kind is not None:
            self.kind = kind
        self.must_precede, self.conflicts_with = tuple(must_precede), tuple(conflicts_with)

    def convert(self, model):
        self.log.append(self.name)
        return model

    def post_optimizer_hook(self, model):
        self.log.append(f"hook:{self.name}")


@pytest.fixture(scope="module")
def qat_run():
    """Trains the tiny model 30 steps with QAT; returns (model, converter, eval tokens, fake-quant logits)."""
    model = _tiny_model()
    converter = Int8DynActInt4WeightQATConverter(groupsize=32)
    model = apply_model_converters(model, [converter])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    eval_tokens = _batch(torch.Generator().manual_seed(123), num=64)
    with torch.no_grad():
        untrained_accuracy = _accuracy(model(eval_tokens), eval_tokens)
    for _ in range(30):
        tokens = _batch(generator)
        _loss(model(tokens), tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        fake_logits = model(eval_tokens)
    print(f"QAT tiny model before training: accuracy {untrained_accuracy:.4f}")
    return model, converter, eval_tokens, fake_logits, initial_state


def test_qat_converter_fake_quantises_every_linear_layer_and_keeps_state_dict_keys(qat_run):
    model, _, _, _, initial_state = qat_run
    plain_keys = set(_tiny_model().state_dict())
    assert set(initial_state) == plain_keys  # checkpoints of a QAT model load into the plain model
    fake = [n for n, m in model.named_modules() if type(m).__name__ == "FakeQuantizedLinear"]
    # 1 layer x (q, k, v, output_proj, w1, w2, w3) + the output projection
    assert len(fake) == 8


def test_qat_then_real_quantisation_keeps_accuracy_and_agrees_with_fake_quant(qat_run):
    model, converter, tokens, fake_logits, _ = qat_run
    fake_acc, fake_loss = _accuracy(fake_logits, tokens), _loss(fake_logits, tokens).item()
    quantized = converter.quantize(model)
    kinds = {type(m.weight).__name__ for m in quantized.modules() if isinstance(m, nn.Linear)}
    assert kinds == {"IntxUnpackedToInt8Tensor"}
    with torch.no_grad():
        real_logits = quantized(tokens)
    real_acc, real_loss = _accuracy(real_logits, tokens), _loss(real_logits, tokens).item()
    max_diff = (real_logits - fake_logits).abs().max().item()
    print(
        f"QAT tiny model: fake-quant accuracy {fake_acc:.4f} loss {fake_loss:.4f}; "
        f"int8/int4 accuracy {real_acc:.4f} loss {real_loss:.4f}; max |logit diff| {max_diff:.2e}"
    )
    # 30 steps of Adam at lr 1e-2 learn the 64-entry bigram table (measured: accuracy 1.0 both ways)
    assert fake_acc > 0.9
    assert real_acc == fake_acc
    assert max_diff < 1e-4 * fake_logits.abs().max().item()
    assert math.isclose(real_loss, fake_loss, rel_tol=1e-4)


def test_qat_on_lora_layers_fake_quantises_the_merged_weight():
    torch.manual_seed(0)
    model = lora_llama3_2(["q_proj", "v_proj"], apply_lora_to_mlp=True, lora_rank=4, lora_alpha=8.0, **TINY)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            nn.init.normal_(module.lora_b.weight, std=0.05)  # a trained adapter, so the merge matters
    converter = QATConverter(groupsize=32)
    converter.convert(model)
    lora = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert lora and all(isinstance(m, FakeQuantizedLoRALinear) for m in lora)
    tokens = _batch(torch.Generator().manual_seed(3), num=4)
    logits = model(tokens)
    logits.sum().backward()
    assert all(m.lora_a.weight.grad is not None and m.weight.grad is None for m in lora)  # STE reaches adapters
    converter.quantize(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), logits.detach(), atol=1e-4, rtol=1e-4)


def test_qat_refuses_what_it_cannot_simulate():
    torch.manual_seed(0)
    dora = lora_llama3_2(["q_proj"], lora_rank=4, lora_alpha=8.0, use_dora=True, **TINY)
    with pytest.raises(ValueError, match="DoRA layers.*use_dora: False"):
        QATConverter(32).convert(dora)
    dropout = lora_llama3_2(["q_proj"], lora_rank=4, lora_alpha=8.0, lora_dropout=0.1, **TINY)
    with pytest.raises(ValueError, match="lora_dropout: 0.0"):
        QATConverter(32).convert(dropout)
    with pytest.raises(ValueError, match="groupsize must be a positive integer"):
        QATConverter(groupsize=0)


def test_qat_skips_layers_whose_input_is_not_a_multiple_of_groupsize():
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 8))
    with pytest.warns(UserWarning, match=r"1 linear layer\(s\) stay unquantised.*: 1"):
        QATConverter(groupsize=32).convert(model)
    assert type(model[0]).__name__ == "FakeQuantizedLinear" and type(model[1]) is nn.Linear


def test_converters_run_in_order_and_hooks_run_after_each_step():
    log: list[str] = []
    first, second = _Recorder("first", log), _Recorder("second", log)
    model = nn.Linear(2, 2)
    assert apply_model_converters(model, [first, second]) is model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handles = register_post_optimizer_hooks(optimizer, model, [first, second])
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    assert log == ["first", "second"] + ["hook:first", "hook:second"] * 2
    for handle in handles:
        handle.remove()
    optimizer.step()
    assert len(log) == 6
    assert apply_model_converters(model, None) is model


def test_converter_must_return_a_module():
    class Broken:
        def convert(self, model):
            return None

    with pytest.raises(TypeError, match=r"model_converters\[0\] \(Broken.*must return the converted nn.Module"):
        apply_model_converters(nn.Linear(2, 2), [Broken()])
    with pytest.raises(TypeError, match="has no convert"):
        apply_model_converters(nn.Linear(2, 2), [object()])


def test_order_rule_names_both_converters_and_the_fix():
    log: list[str] = []
    lora = _Recorder("lora", log, kind="peft")  # declares nothing: QAT's must_follow=("peft",) decides
    # peft then qat is the valid order (QAT knows LoRALinear); the reverse is refused
    validate_converter_order([lora, QATConverter(32)])
    with pytest.raises(
        ValueError,
        match=r"model_converters\[1\] \(_Recorder, kind 'peft'\) must run before "
        r"model_converters\[0\] \(Int8DynActInt4WeightQATConverter.*move it up",
    ):
        validate_converter_order([QATConverter(32), lora])
    first = _Recorder("a", log, kind="a", must_precede=("b",))
    with pytest.raises(ValueError, match=r"model_converters\[1\] \(_Recorder, kind 'a'\) must run before"):
        validate_converter_order([_Recorder("b", log, kind="b"), first])
    # checked on classes too (no GPU needed to validate a float8 config)
    combined = r"Int8DynActInt4WeightQATConverter.*Float8TrainingConverter.*cannot be combined"
    with pytest.raises(ValueError, match=combined):
        validate_converter_order([QATConverter, Float8TrainingConverter])
    # a third-party converter that declares nothing has no constraints
    apply_model_converters(nn.Linear(2, 2), [_Recorder("x", log), QATConverter(2)])


def test_float8_is_refused_without_a_recent_gpu():
    capable = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
    if capable:  # on an Ada/Hopper GPU it must construct; everywhere else it must refuse with the reason
        assert Float8TrainingConverter().kind == "float8"
        return
    reason = "no CUDA device is available" if not torch.cuda.is_available() else "needs compute capability >= 8.9"
    with pytest.raises(ValueError, match=rf"Float8TrainingConverter.*{reason}.*train in bf16"):
        Float8TrainingConverter()


@pytest.mark.integration
def test_quantize_recipe_turns_a_qat_checkpoint_into_the_quantised_model(tmp_path):
    # a QAT-trained checkpoint (tune's keys, safetensors): 10 steps are enough for a non-trivial weight
    model = _tiny_model()
    converter = QATConverter(groupsize=32)
    converter.convert(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        tokens = _batch(generator)
        _loss(model(tokens), tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
    ckpt = tmp_path / "qat"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ckpt / "model.safetensors")
    eval_tokens = _batch(torch.Generator().manual_seed(5), num=1)
    model_args = " ".join(f"model.{k}={v}" for k, v in TINY.items())
    cmd = (
        f"{sys.executable} -m tune._cli.main run quantize --config quantization "
        f"model._component_=tune.models.llama3_2.llama3_2 {model_args} "
        f"checkpointer._component_=tune.training.FullModelTorchTuneCheckpointer checkpointer.checkpoint_dir={ckpt} "
        f"checkpointer.checkpoint_files=[model.safetensors] ~checkpointer.model_type output_dir={tmp_path / 'out'} "
        f"eval_tokens=[{','.join(map(str, eval_tokens[0].tolist()))}]"
    )
    result = subprocess.run(cmd.split(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Quantised vs fake-quantised logits" in result.stderr
    saved = torch.load(tmp_path / "out" / "model_int8dynactint4weight.pt", weights_only=True)
    # the same model quantised in this process (same weights, same converter) gives the same tensors
    with torch.no_grad():
        expected_logits = model(eval_tokens)
    converter.quantize(model)
    assert set(saved) == set(model.state_dict())
    fresh = _tiny_model()
    QATConverter(groupsize=32).quantize(fresh)
    fresh.load_state_dict(saved, assign=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(eval_tokens), expected_logits, atol=1e-4, rtol=1e-4)
