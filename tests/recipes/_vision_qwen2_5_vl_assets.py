"""Tiny Qwen2.5-VL assets for running the shipped ``configs/qwen2_5_vl`` configs end to end on the CPU.

- a Qwen-style ``tokenizer.json`` (tests/tune/data/_tiny_tokenizers.py) whose ``<|image_pad|>``,
  ``<|vision_start|>``, ``<|vision_end|>`` and ``<|video_pad|>`` ids are the tiny checkpoint's;
- two tiny ``transformers.Qwen2_5_VLForConditionalGeneration`` checkpoints (2 language-model layers of width 64,
  2 vision layers of width 32, the second attending over whole images, the first within windows), one with tied
  embeddings (the 3B configs) and one without (7B and up); every setting that is not a dimension comes from the
  family's size table, ``MODEL_SIZES``;
- the colour task of demo/vision_data.py: 84 x 84 pictures, which the image transform keeps at 84 x 84 (6 x 6
  patches of 14 pixels, 3 x 3 image tokens), so that with 56-pixel windows the first vision layer attends within
  windows of 4, 2, 2 and 1 image tokens.
"""

import functools
import json
from pathlib import Path

import torch

from demo.vision_data import write_colour_task
from tests.recipes.utils import save_spread_hf_model
from tests.tune.data import _tiny_tokenizers
from tune.models.qwen2_5_vl._model_builders import MODEL_SIZES

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

IMAGE_SIZE = 84  # pixels: smart_resize keeps it (a multiple of 28 within the pixel budget)
MAX_PIXELS = IMAGE_SIZE * IMAGE_SIZE  # tokenizer.max_pixels: at most 9 image tokens an image
NUM_ROWS = 128  # 4 steps of 2 ranks x 2 rows x 8 micro-batches (the shipped accumulation)
MAX_SEQ_LEN = 256  # the model's (M-RoPE table); the rows are ~40 tokens
# head_dim 16: 8 rotated pairs, split over time, height and width as the released (16, 24, 24) of 64
TEXT_DIMS = dict(num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128)
MROPE_SECTION = [2, 3, 3]
VISION_DIMS = dict(
    vision_embed_dim=32,
    vision_num_layers=2,
    vision_num_heads=2,
    vision_intermediate_dim=48,
    vision_full_attention_layers=[1],
    vision_window_size=56,  # 2 x 2 image tokens (112 would hold a whole 84-pixel picture: no windows at all)
)


def size_row(config_name: str) -> str:
    """The ``MODEL_SIZES`` row a shipped config fine-tunes (``qwen2_5_vl/7B_lora`` -> ``qwen2_5_vl_7b``)."""
    return "qwen2_5_vl_" + config_name.split("/")[1].split("_")[0].lower()


def tied(config_name: str) -> bool:
    return bool(MODEL_SIZES[size_row(config_name)].dims["tie_word_embeddings"])


@functools.cache
def tokenizer_file() -> Path:
    return _tiny_tokenizers.qwen_tokenizer_json() / "tokenizer.json"


@functools.cache
def special_ids() -> dict[str, int]:
    """The tiny tokenizer's vocabulary size and the ids of its vision tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file()))
    names = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|endoftext|>")
    ids = {name: tokenizer.token_to_id(name) for name in names}
    assert all(value is not None for value in ids.values()), ids
    return {**ids, "vocab_size": tokenizer.get_vocab_size()}


def tune_dims(size: str) -> dict:
    """Keyword arguments of ``qwen2_5_vl`` / ``lora_qwen2_5_vl``: tiny dimensions, ``size``'s other settings."""
    released = MODEL_SIZES[size].dims
    return dict(
        vocab_size=special_ids()["vocab_size"],
        **TEXT_DIMS,
        max_seq_len=MAX_SEQ_LEN,
        norm_eps=released["norm_eps"],
        rope_base=released["rope_base"],
        tie_word_embeddings=released["tie_word_embeddings"],
        mrope_section=MROPE_SECTION,
        image_token_id=special_ids()["<|image_pad|>"],
        **VISION_DIMS,
    )


def hf_config(size: str):
    """``transformers.Qwen2_5_VLConfig`` of the tiny model with ``size``'s non-dimension settings (``rope_theta``,
    ``rms_norm_eps``, tied embeddings), written from the released ``config.json`` values."""
    import transformers

    dims, ids = tune_dims(size), special_ids()
    text = dict(
        vocab_size=dims["vocab_size"],
        hidden_size=dims["embed_dim"],
        intermediate_size=dims["intermediate_dim"],
        num_hidden_layers=dims["num_layers"],
        num_attention_heads=dims["num_heads"],
        num_key_value_heads=dims["num_kv_heads"],
        max_position_embeddings=MAX_SEQ_LEN,
        rms_norm_eps=dims["norm_eps"],
        rope_parameters=dict(rope_type="default", rope_theta=dims["rope_base"], mrope_section=MROPE_SECTION),
        tie_word_embeddings=dims["tie_word_embeddings"],
        hidden_act="silu",
        bos_token_id=None,  # Qwen's tokenizer has no BOS
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = dict(
        depth=dims["vision_num_layers"],
        hidden_size=dims["vision_embed_dim"],
        intermediate_size=dims["vision_intermediate_dim"],
        num_heads=dims["vision_num_heads"],
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
        window_size=dims["vision_window_size"],
        out_hidden_size=dims["embed_dim"],
        fullatt_block_indexes=dims["vision_full_attention_layers"],
        hidden_act="silu",
    )
    return transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=dims["tie_word_embeddings"],
    )


def build(root: Path) -> Path:
    """Writes ``root/tied/`` and ``root/untied/`` (tiny HF checkpoints, one ``model.safetensors`` each) and the
    colour task (``root/train.json`` and its pictures)."""
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    for name, size in (("tied", "qwen2_5_vl_3b"), ("untied", "qwen2_5_vl_7b")):
        torch.manual_seed(0)
        model = transformers.Qwen2_5_VLForConditionalGeneration(hf_config(size)).float()
        with torch.no_grad():  # norms away from one and biases away from zero, so that every weight matters
            for param_name, param in model.named_parameters():
                if "norm" in param_name or "ln_q" in param_name:
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
                elif param.dim() == 1:
                    param.normal_(0.0, 0.05)
        save_spread_hf_model(model, root / name)  # matrices N(0, 0.08)
    write_colour_task(root, NUM_ROWS, seed=0, image_size=IMAGE_SIZE)
    return root


def checkpoint_dir(root: Path, config_name: str) -> Path:
    return root / ("tied" if tied(config_name) else "untied")


def model_overrides(config_name: str, method: str) -> list[str]:
    """``model.*`` overrides: the family's component builder with the tiny dimensions (LoRA settings kept)."""
    builder = "qwen2_5_vl" if method == "full" else "lora_qwen2_5_vl"
    overrides = [f"model._component_=tune.models.qwen2_5_vl.{builder}"]
    if method == "qlora":  # what the shipped qlora_* builder adds to lora_*
        overrides.append("model.quantize_base=True")
    for key, value in tune_dims(size_row(config_name)).items():
        overrides.append(f"model.{key}={json.dumps(value)}")
    return overrides


def tiny_run_overrides(config_name: str, method: str, root: Path, out: Path, steps: int) -> list[str]:
    """Command-line changes that run a shipped config at tiny scale on the CPU: the tiny model, tokenizer, pixel
    budget and checkpoint, the colour task, fp32, ``steps`` steps of 2 rows, outputs in ``out``."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *model_overrides(config_name, method),
        f"tokenizer.path={tokenizer_file()}",
        f"tokenizer.max_pixels={MAX_PIXELS}",
        f"checkpointer.checkpoint_dir={checkpoint_dir(root, config_name)}",
        "dataset.subset=null",
        "dataset.source=json",
        f"dataset.data_files={root / 'train.json'}",
        "dataset.split=train",
        "batch_size=2",
        f"max_steps_per_epoch={steps}",
    ]
