"""The three vision-language families on the tier's device: the tiny random models of the CPU parity tests
(tests/tune/models/test_{gemma3_vision,qwen2_5_vl,llama3_2_vision}.py, whose logits equal transformers' on the CPU),
each on a padded batch with images of several sizes and a text-only row.

- fp32 on the device against fp32 on the CPU: logits (the device runs other attention and matmul kernels);
- bf16 on the device: the loss of a training step against fp32's, and finite gradients everywhere that trains;
- a bf16 training step (forward, backward) with the batch moved by ``training.batch_to_device`` makes no host-device
  synchronisation (``torch.cuda.set_sync_debug_mode("error")``): the step invariant of every recipe.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.gpu._checks import DEVICE, compare, skip_on_cpu
from tune import training

pytestmark = pytest.mark.gpu

transformers = pytest.importorskip("transformers")

FAMILIES = ("gemma3_vision", "qwen2_5_vl", "llama3_2_vision")
# fp32 logits of ~5 in magnitude through a few layers, summed in another order on the device
FP32_TOLERANCE = dict(rel=1e-4, abs=1e-4)
# bf16 keeps 8 significant bits; a mean loss over the batch through a few layers: a few units of 2^-8
BF16_LOSS_REL = 2**-5


def _spread(hf_model, norm_scale: float = 0.2) -> None:
    with torch.no_grad():  # random weights everywhere, as the CPU parity tests set them
        for name, param in hf_model.named_parameters():
            if "norm" in name or "ln_q" in name:
                param.copy_(1.0 + norm_scale * torch.randn_like(param))
            elif "gate" in name:
                param.copy_(torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)


def _gemma3_vision():
    from tests.tune.models import test_gemma3_vision as case
    from tune.models.gemma3_vision import gemma3_vision_from_hf_config, gemma3_vision_hf_to_tune

    config = transformers.Gemma3Config(
        text_config=case.TEXT, vision_config=case.VISION, mm_tokens_per_image=case.TOKENS_PER_IMAGE,
        boi_token_index=case.BOI, eoi_token_index=case.EOI, image_token_index=case.IMAGE,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.Gemma3ForConditionalGeneration(config).float()
    _spread(hf_model)
    hf_config = config.to_dict()
    model = gemma3_vision_from_hf_config(hf_config)
    model.load_state_dict(gemma3_vision_hf_to_tune(hf_model.state_dict(), hf_config))
    torch.manual_seed(1)
    tokens, attention_mask = case._batch([case._row(3, "image", 5, "image", 2), case._row(7), case._row("image", 4)])
    seq_len = tokens.shape[1]
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()[None] & attention_mask.bool()[:, None, :]
    batch = {"tokens": tokens, "mask": mask, "encoder_input": {"images": torch.randn(3, 3, 32, 32)}}
    return model, batch, attention_mask.bool()


def _qwen2_5_vl():
    from tests.tune.models import test_qwen2_5_vl as case
    from tune.models.qwen2_5_vl import qwen2_5_vl_from_hf_config, qwen2_5_vl_hf_to_tune

    config = transformers.Qwen2_5_VLConfig(
        text_config=case.TEXT, vision_config=case.VISION, image_token_id=case.IMAGE,
        vision_start_token_id=case.VISION_START, vision_end_token_id=case.VISION_END,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration(config).float()
    _spread(hf_model)
    hf_config = config.to_dict()
    model = qwen2_5_vl_from_hf_config(hf_config)
    model.load_state_dict(qwen2_5_vl_hf_to_tune(hf_model.state_dict(), hf_config))
    torch.manual_seed(1)
    grids = [(1, 8, 12), (1, 6, 4), (1, 4, 4)]
    tokens, real = case._batch([case._row(3, grids[0], 4, grids[1], 2), case._row(9), case._row(grids[2], 5)])
    seq_len = tokens.shape[1]
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()[None] & real[:, None, :]
    batch = {"tokens": tokens, "mask": mask, "encoder_input": case._images(grids)}
    return model, batch, real


def _llama3_2_vision():
    from tests.tune.models import test_llama3_2_vision as case
    from tune.models.llama3_2_vision import llama3_2_vision_from_hf_config, llama3_2_vision_hf_to_tune

    config = transformers.MllamaConfig(text_config=case.TEXT, vision_config=case.VISION, image_token_index=case.IMAGE)
    torch.manual_seed(0)
    hf_model = transformers.MllamaForConditionalGeneration(config).float()
    _spread(hf_model)
    hf_config = config.to_dict()
    model = llama3_2_vision_from_hf_config(hf_config)
    model.load_state_dict(llama3_2_vision_hf_to_tune(hf_model.state_dict(), hf_config))
    torch.manual_seed(1)
    grids = [[(2, 2), (1, 2)], [], [(2, 1)]]
    rows = [[case.IMAGE, *case._text(4), case.IMAGE, *case._text(6)], case._text(9), [case.IMAGE, *case._text(5)]]
    seq_len = max(map(len, rows))
    tokens = torch.zeros(len(rows), seq_len, dtype=torch.long)
    real = torch.zeros(len(rows), seq_len, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)], real[i, : len(row)] = torch.tensor(row), True
    ours, _ = case._images(grids)
    _, encoder_mask = case._cross_attention_mask(tokens, grids, 2)
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()[None] & real[:, None, :]
    batch = {"tokens": tokens, "mask": mask, "encoder_input": ours, "encoder_mask": encoder_mask}
    return model, batch, real


BUILD = {"gemma3_vision": _gemma3_vision, "qwen2_5_vl": _qwen2_5_vl, "llama3_2_vision": _llama3_2_vision}


def _forward(model, batch):
    return model(batch["tokens"], **training.model_inputs(batch))


def _loss(model, batch, real):
    logits = _forward(model, batch)[:, :-1].float()
    labels = batch["tokens"][:, 1:]
    labels = labels.masked_fill(~real[:, 1:] | (labels >= logits.shape[-1]), -100)  # padding; Llama's <|image|>
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_on_device_match_cpu(family):
    model, batch, real = BUILD[family]()
    model.eval()
    with torch.no_grad():
        expected = _forward(model, batch)
        device_model = copy.deepcopy(model).to(DEVICE)
        actual = _forward(device_model, training.batch_to_device(batch, torch.device(DEVICE))).cpu()
    assert expected[real].abs().max() > 1.0  # not a comparison of near-zero logits
    problem = compare(f"{family} fp32 logits, {DEVICE} vs cpu", actual[real], expected[real], **FP32_TOLERANCE)
    assert problem is None, problem


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_training_step_on_device(family):
    model, batch, real = BUILD[family]()
    device = torch.device(DEVICE)
    on_device = training.batch_to_device(batch, device)
    reference = copy.deepcopy(model).to(device)
    expected = _loss(reference, on_device, real.to(device)).item()
    model = model.to(device=device, dtype=torch.bfloat16)
    loss = _loss(model, on_device, real.to(device))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), f"{family}: a missing or non-finite grad"
    problem = compare(f"{family} bf16 loss vs fp32", loss.item(), expected, rel=BF16_LOSS_REL)
    assert problem is None, problem


@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_makes_no_host_sync(family):
    skip_on_cpu("host-device synchronisation exists only with a CUDA device")
    model, batch, real = BUILD[family]()
    device = torch.device(DEVICE)
    model = model.to(device=device, dtype=torch.bfloat16)
    real = real.to(device)
    _loss(model, training.batch_to_device(batch, device), real).backward()  # warm-up: lazy inits may sync
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    on_device = training.batch_to_device(batch, device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _loss(model, on_device, real).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
