"""Llama 3.2 Vision through the recipes: every shipped ``configs/llama3_2_vision/*.yaml``, end to end at tiny scale.

Each config is used as shipped and changed on the command line only (tests/recipes/_vision_llama_assets.py): the
model node becomes the family's component builder at tiny dimensions (trainable parts and LoRA settings kept), the
tokenizer is a tiny tiktoken file at 28-pixel tiles, the data is the offline colour task (The Cauldron's layout)
of demo/vision_data.py, and ``device=cpu dtype=fp32 batch_size=2 max_steps_per_epoch=4`` with a checkpoint every
step; anything else a config needed on the CPU would be listed in ``CPU_OVERRIDES``. The config's accumulation (8
micro-batches), schedule, optimizer, loss, shuffling and ``seed: null`` are kept.

Checked:

- every config: 4 finite losses, a checkpoint per step, the output loads in transformers'
  ``MllamaForConditionalGeneration`` with no missing, unexpected or mismatched weight, and holds exactly what tune
  saved (the file's tensors, and tune's keys converted back to them);
- full and LoRA: what the config leaves untrained is bit-identical to the input checkpoint, what it trains moved;
- LoRA: the PEFT adapter loads over the input model in transformers (every adapter weight used, no other module
  adapted) and gives the logits of the merged checkpoint read by tune. transformers 5.23 differs from Meta's model
  (which tune follows) in the encoder layers it concatenates and in text with no image to attend: the reference
  is built with each encoder index minus one, and the prompt starts with the image token
  (tests/tune/models/test_llama3_2_vision.py). The LoRA runs start from a random PEFT adapter
  (``checkpointer.adapter_checkpoint``) so that, four steps into the shipped warm-up, the adapter still moves the
  logits far beyond the tolerance;
- resume (full and LoRA single device): from the step-2 checkpoint, steps 3 and 4 log the uninterrupted run's
  losses within 1e-6 and end with its weights;
- distributed configs: 2 gloo ranks of 1 sample each log the losses of one device running the matching
  single-device config with 2 samples, within 1e-5 (``seed=0`` on both, so that they shuffle alike).

Default tier: the 11B full and LoRA single-device configs; the others are slow.
"""

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes import _vision_llama_assets as assets
from tests.recipes.dist_utils import run_concurrently, run_distributed
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "llama3_2_vision"
# config -> (recipe, the single-device config a distributed one is compared with)
_RECIPES = {
    "11B_full_single_device": "full_finetune_single_device",
    "11B_lora_single_device": "lora_finetune_single_device",
    "11B_qlora_single_device": "lora_finetune_single_device",
    "11B_full": "full_finetune_distributed",
    "11B_lora": "lora_finetune_distributed",
    "11B_qlora": "lora_finetune_distributed",
    "90B_full": "full_finetune_distributed",
    "90B_lora": "lora_finetune_distributed",
    "90B_qlora": "lora_finetune_distributed",
}
SINGLE_DEVICE = [name for name in sorted(_RECIPES) if name.endswith("_single_device")]
DISTRIBUTED = [name for name in sorted(_RECIPES) if not name.endswith("_single_device")]
# the shipped configs this file runs (test_every_config.py leaves them to it)
CONFIGS = [f"llama3_2_vision/{name}" for name in sorted(_RECIPES)]
DEFAULT_TIER = {"11B_full_single_device", "11B_lora_single_device"}
NUM_STEPS, RESUME_FROM = 4, 2
# Overrides beyond dimensions, tokenizer, data, paths, device, dtype, batch size and steps that the shipped configs
# need on the CPU (each one a finding about the shipped configs; none was needed).
CPU_OVERRIDES: list[str] = []


@pytest.fixture(scope="session")
def vision_assets() -> Path:
    return assets.shared_assets()


def test_every_shipped_training_config_is_a_case():
    # generation and evaluation configs are another recipe's (tests/recipes/test_generate.py, test_eleuther_eval.py)
    training = [p.stem for p in CONFIG_DIR.glob("*.yaml") if any(m in p.stem for m in ("_full", "_lora", "_qlora"))]
    assert sorted(training) == sorted(_RECIPES)


def _model_node(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["model"]


def _method(name: str) -> str:
    return "full" if "_full" in name else "qlora" if "_qlora" in name else "lora"


def _overrides(name: str, data: Path, out: Path, adapter: Path | None) -> list[str]:
    overrides = [
        *assets.tiny_run_overrides(_model_node(name)["_component_"], data, out, NUM_STEPS),
        "save_every_n_steps=1",
        *CPU_OVERRIDES,
    ]
    if adapter is not None:
        overrides.append(f"checkpointer.adapter_checkpoint={adapter}")
    return overrides


def _run(name: str, overrides: list[str], cwd: Path, nproc: int = 1):
    config = CONFIG_DIR / f"{name}.yaml"
    if nproc > 1:
        return run_distributed(_RECIPES[name], config, overrides, cwd=cwd, nproc=nproc)
    return run_recipe(_RECIPES[name], config, overrides, cwd=cwd, timeout=300)


def _losses(out: Path) -> dict[int, float]:
    (log,) = (out / "logs").glob("*.jsonl")
    return {r["step"]: r["loss"] for r in read_jsonl(log) if "loss" in r}


def _hf_module_pattern(node: dict) -> str:
    """A regular expression (PEFT's ``target_modules``) on transformers' module names: the modules tune adapts
    under the config's LoRA settings, written from Mllama's layout (not from tune's code)."""
    hf_attn = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
    attn = "|".join(hf_attn[m] for m in node["lora_attn_modules"])
    mlp = node.get("apply_lora_to_mlp", False)
    vision = rf"(self_attn\.({attn})" + (r"|mlp\.(fc1|fc2)" if mlp else "") + ")"
    text = rf"\.({{kind}}\.({attn})" + (r"|mlp\.(gate_proj|up_proj|down_proj)" if mlp else "") + ")"
    cross = assets.hf_cross_attention_layers()
    selfs = [i for i in range(assets.NUM_LAYERS + len(cross)) if i not in cross]
    patterns = []
    if node["encoder_trainable"] == "lora":
        patterns.append(rf"model\.vision_model\.transformer\.layers\.\d+\.{vision}")
    if node["fusion_trainable"] == "lora":
        patterns.append(rf"model\.vision_model\.global_transformer\.layers\.\d+\.{vision}")
        patterns.append(
            r"model\.language_model\.layers\.(" + "|".join(map(str, cross)) + ")" + text.format(kind="cross_attn")
        )
        if node.get("apply_lora_to_output"):
            patterns.append(r"model\.multi_modal_projector")
    if node["decoder_trainable"] == "lora":
        patterns.append(
            r"model\.language_model\.layers\.(" + "|".join(map(str, selfs)) + ")" + text.format(kind="self_attn")
        )
        if node.get("apply_lora_to_output"):
            patterns.append("lm_head")
    return "|".join(f"({p})" for p in patterns)


def _initial_adapter(name: str, data: Path, where: Path) -> Path:
    """A PEFT adapter with random A and B for the config's LoRA settings, made by PEFT over the input model."""
    from peft import LoraConfig, get_peft_model
    from transformers import MllamaForConditionalGeneration

    node = _model_node(name)
    base = MllamaForConditionalGeneration.from_pretrained(data / "hf", dtype=torch.float32)
    config = LoraConfig(
        r=node["lora_rank"],
        lora_alpha=node["lora_alpha"],
        lora_dropout=0.0,
        target_modules=_hf_module_pattern(node),
        init_lora_weights=False,
    )
    torch.manual_seed(1)
    peft_model = get_peft_model(base, config)
    with torch.no_grad():  # PEFT's random B is as large as A; smaller keeps the tiny model's losses sane
        for param_name, param in peft_model.named_parameters():
            if "lora_B" in param_name:
                param.mul_(0.1)
    peft_model.save_pretrained(where)
    return where


def _crashed_copy(out: Path, where: Path) -> Path:
    """The output directory as a crash after step 2 leaves it: later checkpoints and the log removed."""
    shutil.copytree(out, where)
    shutil.rmtree(where / "logs")
    for later in range(RESUME_FROM + 1, NUM_STEPS + 1):
        for path in (where / f"step_{later}", where / "dcp" / f"step_{later}"):
            if path.exists():
                shutil.rmtree(path)
    return where


def _file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _to_module_tree(key: str) -> str:
    """A key of the files' layout -> transformers 5's module tree (the released files' prefixes)."""
    for files, tree in (
        ("language_model.lm_head.", "lm_head."),
        ("language_model.model.", "model.language_model."),
        ("vision_model.", "model.vision_model."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ):
        if key.startswith(files):
            return tree + key.removeprefix(files)
    return key


def _load_strict(directory: Path, config=None):
    """``MllamaForConditionalGeneration.from_pretrained``, asserting every weight was found and used as saved."""
    from transformers import MllamaForConditionalGeneration

    kwargs = {"config": config} if config is not None else {}
    model, info = MllamaForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True, **kwargs
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"{directory}: {problems}"
    return model.eval()


def _check_output_in_transformers(step_dir: Path) -> None:
    """transformers loads the output strictly and holds exactly its tensors; tune's keys converted back give the
    file again, key for key and bit for bit."""
    import json

    from tune.models.llama3_2_vision import llama3_2_vision_hf_to_tune, llama3_2_vision_tune_to_hf

    files = _file_tensors(step_dir)
    hf_state = _load_strict(step_dir).state_dict()
    assert sorted(hf_state) == sorted(_to_module_tree(k) for k in files)
    assert all(torch.equal(hf_state[_to_module_tree(k)], v) for k, v in files.items())
    hf_config = json.loads((step_dir / "config.json").read_text())
    back = llama3_2_vision_tune_to_hf(llama3_2_vision_hf_to_tune(files, hf_config), hf_config)
    assert back.keys() == files.keys() and all(torch.equal(back[k], files[k]) for k in files)


def _tune_model(name: str, quantize: bool = False):
    """The tiny tune model with the config's trainable parts (for which parameters train), on the meta device."""
    from tune.models.llama3_2_vision import llama3_2_vision, lora_llama3_2_vision

    node = {k: v for k, v in _model_node(name).items() if k not in ("_component_", "image_size")}
    dims = {**assets.tune_dims(), "image_size": assets.TILE_SIZE}
    with torch.device("meta"):
        if _method(name) == "full":
            return llama3_2_vision(**node, **dims)
        return lora_llama3_2_vision(**node, **dims, quantize_base=quantize)


def _check_untrained_parts_unchanged(name: str, data: Path, step_dir: Path) -> None:
    """In tune's keys: every weight the config does not train (no gradient, and for LoRA not the base of an adapted
    layer) is bit-identical to the input; for a full fine-tune, every trained tensor moved."""
    import json

    from tune.models.llama3_2_vision import llama3_2_vision_hf_to_tune

    hf_config = json.loads((data / "hf" / "config.json").read_text())
    before = llama3_2_vision_hf_to_tune(_file_tensors(data / "hf"), hf_config)
    after = llama3_2_vision_hf_to_tune(_file_tensors(step_dir), hf_config)
    model = _tune_model(name)
    adapted = {n.rsplit(".lora_a.", 1)[0] for n, _ in model.named_parameters() if ".lora_a." in n}
    trained, frozen = [], []
    for param_name, param in model.named_parameters():
        if ".lora_a." in param_name or ".lora_b." in param_name or param_name.endswith(".magnitude"):
            continue
        module = param_name.rsplit(".", 1)[0]
        (trained if param.requires_grad or module in adapted else frozen).append(param_name)
    assert before.keys() == after.keys() and set(trained + frozen) == set(after)
    assert frozen and trained
    changed = [key for key in frozen if not torch.equal(before[key], after[key])]
    assert not changed, f"untrained weights changed: {changed[:5]}"
    if _method(name) == "full":
        unmoved = [key for key in trained if torch.equal(before[key], after[key])]
        assert not unmoved, f"trained weights did not move: {unmoved[:5]}"


def _probe_inputs():
    """One prompt that starts with the image token (so every text token attends the image): an image of 2 x 2
    tiles, as tune's ``encoder_input``/``encoder_mask`` and as transformers' inputs."""
    tile, max_tiles = assets.TILE_SIZE, assets.MAX_NUM_TILES
    tokens_per_tile = (tile // 14) ** 2 + 1
    generator = torch.Generator().manual_seed(7)
    seq_len = 24
    tokens = torch.randint(3, assets.vocab_size() - 256, (1, seq_len), generator=generator)
    tokens[0, 0] = assets.vocab_size()  # <|image|>
    images = torch.zeros(1, 1, max_tiles, 3, tile, tile)
    images[0, 0, :4] = torch.randn(4, 3, tile, tile, generator=generator)
    ours = {"images": images, "aspect_ratio": torch.tensor([[[2, 2]]])}
    ratios = [(h, w) for h in range(1, max_tiles + 1) for w in range(1, max_tiles + 1) if h * w <= max_tiles]
    mask = torch.zeros(1, seq_len, 1, max_tiles, dtype=torch.long)
    mask[0, :, 0, :4] = 1
    theirs = dict(
        input_ids=tokens,
        pixel_values=images,
        aspect_ratio_ids=torch.tensor([[ratios.index((2, 2)) + 1]]),
        aspect_ratio_mask=torch.ones(1, 1, max_tiles, dtype=torch.long),
        cross_attention_mask=mask,
    )
    encoder_mask = mask.bool().repeat_interleave(tokens_per_tile, dim=3).reshape(1, seq_len, -1)
    return tokens, ours, encoder_mask, theirs


def _check_peft(name: str, data: Path, step_dir: Path) -> None:
    """The PEFT adapter over the input model (transformers computing as Meta's model) gives the logits tune gives
    with the merged checkpoint."""
    import json
    import warnings

    from peft import PeftModel

    from tune.models.llama3_2_vision import llama3_2_vision, llama3_2_vision_hf_to_tune

    reference_config = assets.hf_config([i - 1 for i in assets.CLIP_HIDDEN_STATES])
    base = _load_strict(data / "hf", config=reference_config)
    tokens, ours, encoder_mask, theirs = _probe_inputs()
    with torch.no_grad():
        base_logits = base(**theirs).logits
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            adapted = PeftModel.from_pretrained(base, step_dir / "adapter").eval()
        missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
        assert not missing, missing[0][:2000]
        peft_logits = adapted(**theirs).logits
    adapter_config = json.loads((step_dir / "adapter" / "adapter_config.json").read_text())
    num_adapted = sum(1 for n, _ in adapted.named_modules() if n.endswith(".lora_A"))
    assert num_adapted == len(adapter_config["target_modules"])  # nothing outside tune's adapted layers

    hf_config = json.loads((step_dir / "config.json").read_text())
    model = llama3_2_vision(**assets.tune_dims(), image_size=assets.TILE_SIZE).eval()
    model.load_state_dict(llama3_2_vision_hf_to_tune(_file_tensors(step_dir), hf_config), strict=True)
    with torch.no_grad():
        merged_logits = model(tokens, encoder_input=ours, encoder_mask=encoder_mask)
    error = (merged_logits - peft_logits).abs().max().item()
    moved = (peft_logits - base_logits).abs().max().item()
    print(f"{name}: PEFT vs merged logits max abs error {error:.2e}; the adapter moves them by {moved:.2e}")
    assert error <= 1e-4 and moved > 1e-2


def _check_resumed(resumed_out: Path, uninterrupted: dict[int, float], final: Path) -> None:
    resumed = _losses(resumed_out)
    assert sorted(resumed) == list(range(RESUME_FROM + 1, NUM_STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), (step, resumed, uninterrupted)
    expected, actual = _file_tensors(final), _file_tensors(resumed_out / f"step_{NUM_STEPS}")
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-6, rtol=0, msg=key)


def _check_trained(out: Path) -> dict[int, float]:
    losses = _losses(out)
    assert sorted(losses) == list(range(1, NUM_STEPS + 1))
    assert all(torch.isfinite(torch.tensor(list(losses.values()))))
    assert all((out / f"step_{step}" / "model.safetensors").is_file() for step in range(1, NUM_STEPS + 1))
    return losses


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT_TIER else pytest.mark.slow) for n in SINGLE_DEVICE]
)
def test_shipped_single_device_config_trains_resumes_and_loads_in_hf(vision_assets, tmp_path, name):
    method = _method(name)
    adapter = _initial_adapter(name, vision_assets, tmp_path / "initial_adapter") if method != "full" else None
    out = tmp_path / "run"
    _run(name, _overrides(name, vision_assets, out, adapter), tmp_path)
    uninterrupted = _check_trained(out)
    final = out / f"step_{NUM_STEPS}"
    _check_output_in_transformers(final)
    if method != "qlora":  # QLoRA's merged base is NF4-rounded: its untouched weights are not bit-identical
        _check_untrained_parts_unchanged(name, vision_assets, final)
    if method == "lora":
        _check_peft(name, vision_assets, final)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    _run(name, [*_overrides(name, vision_assets, resumed_out, adapter), "resume_from_checkpoint=True"], tmp_path)
    _check_resumed(resumed_out, uninterrupted, final)


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTED)
def test_shipped_distributed_config_equals_one_device(vision_assets, tmp_path, name):
    method = _method(name)
    single = f"11B_{method}_single_device"
    adapter = _initial_adapter(name, vision_assets, tmp_path / "initial_adapter") if method != "full" else None
    dist_out, single_out = tmp_path / "dist", tmp_path / "single"
    dist_overrides = [o for o in _overrides(name, vision_assets, dist_out, adapter) if not o.startswith("batch_size=")]
    run_concurrently(
        lambda: _run(name, [*dist_overrides, "batch_size=1", "seed=0"], tmp_path, nproc=2),
        lambda: _run(single, [*_overrides(single, vision_assets, single_out, adapter), "seed=0"], tmp_path),
    )
    distributed, one_device = _check_trained(dist_out), _check_trained(single_out)
    for step, loss in distributed.items():
        assert loss == pytest.approx(one_device[step], abs=1e-5, rel=0), (step, distributed, one_device)
    _check_output_in_transformers(dist_out / f"step_{NUM_STEPS}")
