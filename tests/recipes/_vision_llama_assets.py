"""Tiny Llama 3.2 Vision assets, for running the vision configs end to end on the CPU.

:func:`build_llama_vision_assets` writes, under one directory:

- ``hf/``: a randomly initialised ``transformers.MllamaForConditionalGeneration`` (4 self-attention layers with a
  cross-attention layer before the 2nd and the 4th, a 3-layer CLIP with 2 global layers at 28-pixel tiles), saved
  with ``save_pretrained``. Every setting that is not a dimension (RoPE base and scaling, norm epsilon, patch
  size, tiles per image, the 8 new token embeddings) is the released 11B's, read from tune's ``MODEL_SIZES``;
- ``tokenizer.model``: the tiny Llama 3 tiktoken file of tests/tune/data/_tiny_tokenizers.py; with the built-in
  special tokens ``<|image|>`` is the first id after the model's vocabulary, as in the releases;
- ``train.json``: the offline colour task of demo/vision_data.py (The Cauldron's layout) at a small image size.

:func:`model_overrides` and :func:`tiny_run_overrides` turn a shipped (or torchtune's) vision config into a tiny
run: the model node becomes the family's component builder (``llama3_2_vision`` / ``lora_llama3_2_vision``) at
the tiny dimensions, the config's trainable parts and LoRA settings kept.
"""

import atexit
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from demo.vision_data import write_colour_task
from tests.tune.data._tiny_tokenizers import tiktoken_file
from tune.models.llama3_2_vision._model_builders import MODEL_SIZES

SIZE = "llama3_2_vision_11b"  # the row whose non-dimension settings the tiny model keeps
# the language model: 4 layers (a fusion layer before the 2nd and the 4th), head_dim 16, GQA 4 : 2
EMBED_DIM, NUM_HEADS, NUM_KV_HEADS, INTERMEDIATE_DIM, NUM_LAYERS, FUSION_INTERVAL = 64, 4, 2, 128, 4, 2
# the encoder: 28-pixel tiles of 14-pixel patches (5 tokens per tile with the class token)
TILE_SIZE, CLIP_EMBED_DIM, VISION_NUM_HEADS, CLIP_NUM_LAYERS, NUM_GLOBAL_LAYERS = 28, 32, 2, 3, 2
CLIP_HIDDEN_STATES = [1, 2]
MAX_NUM_TILES = MODEL_SIZES[SIZE].dims["max_num_tiles"]
NUM_SPECIAL_TOKENS = MODEL_SIZES[SIZE].dims["num_special_tokens"]
MAX_SEQ_LEN = 128  # the colour task's rows are 20-40 tokens long
IMAGE_SIZE = 40  # the task's pictures: a little larger than a tile, so images take one to four tiles
NUM_ROWS = 64  # 4 steps of 8 micro-batches of 2 (the shipped accumulation)


def vocab_size() -> int:
    """The language model's vocabulary: the tiny tiktoken ranks and Llama 3's 256 special tokens; ``<|image|>``
    is the next id (the first of the 8 new embeddings)."""
    return len(tiktoken_file().read_text().splitlines()) + 256


def tune_dims() -> dict:
    """Keyword arguments of ``llama3_2_vision``: the 11B's settings at the tiny dimensions."""
    dims = dict(MODEL_SIZES[SIZE].dims)
    dims.update(
        vocab_size=vocab_size(),
        num_layers=NUM_LAYERS,
        fusion_interval=FUSION_INTERVAL,
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        embed_dim=EMBED_DIM,
        intermediate_dim=INTERMEDIATE_DIM,
        max_seq_len=MAX_SEQ_LEN,
        encoder_max_seq_len=MAX_NUM_TILES * ((TILE_SIZE // dims["patch_size"]) ** 2 + 1),
        vision_num_heads=VISION_NUM_HEADS,
        clip_embed_dim=CLIP_EMBED_DIM,
        clip_num_layers=CLIP_NUM_LAYERS,
        clip_hidden_states=CLIP_HIDDEN_STATES,
        num_layers_projection=NUM_GLOBAL_LAYERS,
    )
    return dims


def hf_cross_attention_layers() -> list[int]:
    """transformers' indices of the cross-attention layers: one before every ``FUSION_INTERVAL``-th layer."""
    layers, index = [], 0
    for layer in range(NUM_LAYERS):
        if layer % FUSION_INTERVAL == FUSION_INTERVAL - 1:
            layers.append(index)
            index += 1
        index += 1
    return layers


def hf_config(intermediate_layers_indices: list[int] | None = None):
    """The tiny ``MllamaConfig`` (meta-llama/Llama-3.2-11B-Vision-Instruct's settings, tiny dimensions).

    Args:
        intermediate_layers_indices (list[int] | None): the encoder layers transformers concatenates. Default the
            tiny model's (tune's ``clip_hidden_states``). transformers 5.23 takes the outputs of these layers where
            Meta's model and tune take their inputs: a transformers model that computes as tune does is built with
            each index minus one (tests/tune/models/test_llama3_2_vision.py).
    """
    import transformers

    from tune.models.llama3_2_vision import llama3_2_vision_transform

    tokenizer = llama3_2_vision_transform(str(tiktoken_file()), image_size=TILE_SIZE)
    dims = tune_dims()
    rope = dict(
        rope_type="llama3",
        rope_theta=dims["rope_base"],
        factor=dims["scale_factor"],
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    text = dict(
        vocab_size=dims["vocab_size"],
        hidden_size=EMBED_DIM,
        intermediate_size=INTERMEDIATE_DIM,
        num_hidden_layers=NUM_LAYERS + len(hf_cross_attention_layers()),
        cross_attention_layers=hf_cross_attention_layers(),
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_SEQ_LEN,
        rms_norm_eps=dims["norm_eps"],
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )
    vision = dict(
        hidden_size=CLIP_EMBED_DIM,
        intermediate_size=4 * CLIP_EMBED_DIM,
        num_hidden_layers=CLIP_NUM_LAYERS,
        num_global_layers=NUM_GLOBAL_LAYERS,
        attention_heads=VISION_NUM_HEADS,
        image_size=TILE_SIZE,
        patch_size=dims["patch_size"],
        max_num_tiles=MAX_NUM_TILES,
        intermediate_layers_indices=intermediate_layers_indices or CLIP_HIDDEN_STATES,
        vision_output_dim=CLIP_EMBED_DIM * (len(CLIP_HIDDEN_STATES) + 1),
        norm_eps=1e-5,
    )
    return transformers.MllamaConfig(
        text_config=text, vision_config=vision, image_token_index=vocab_size(), tie_word_embeddings=False
    )


def save_hf_model(path: Path, seed: int = 0) -> None:
    """A random tiny Mllama saved with ``save_pretrained``: matrices N(0, 0.08) as
    tests/recipes/utils.save_spread_hf_model; the tanh gates (zero at initialisation, which would hide the image
    from the language model) uniform in [0.5, 1.5) with a random sign."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.MllamaForConditionalGeneration(hf_config()).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "gate" in name and param.dim() <= 1:
                param.copy_((torch.rand_like(param) + 0.5) * torch.sign(torch.randn_like(param)))
            elif param.dim() > 1:
                param.normal_(0.0, 0.08)
    model.save_pretrained(path, safe_serialization=True)


def build_llama_vision_assets(root: Path) -> Path:
    """Writes ``root/hf/`` (the tiny checkpoint), ``root/tokenizer.model`` and ``root/train.json`` (64 rows of the
    colour task, images under ``root/images_train/``); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    save_hf_model(root / "hf")
    shutil.copy(tiktoken_file(), root / "tokenizer.model")
    write_colour_task(root, NUM_ROWS, seed=0, image_size=IMAGE_SIZE, name="train")
    return root


def _method(model_component: str) -> str:
    builder = model_component.rsplit(".", 1)[-1]
    return "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"


def model_overrides(model_component: str) -> list[str]:
    """``model.*`` overrides: the component builder matching the config's builder (full, LoRA or QLoRA) at the
    tiny dimensions; the config's trainable parts, LoRA settings and ``image_size`` key are kept (its value is
    set to the tiny tile)."""
    method = _method(model_component)
    overrides = [
        "model._component_=tune.models.llama3_2_vision."
        + ("llama3_2_vision" if method == "full" else "lora_llama3_2_vision")
    ]
    if method == "qlora":  # what the qlora_* builders add to lora_*
        overrides.append("model.quantize_base=True")
    for key, value in tune_dims().items():
        overrides.append(f"model.{key}={json.dumps(value, separators=(',', ':'))}")
    overrides.append(f"model.image_size={TILE_SIZE}")
    return overrides


def tiny_run_overrides(model_component: str, data: Path, out: Path, steps: int) -> list[str]:
    """Command-line changes that run a vision config at tiny scale on the CPU: the tiny model, tokenizer and
    checkpoint, the colour task in ``data``, fp32, ``steps`` steps of 2 samples, outputs in ``out``."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *model_overrides(model_component),
        f"tokenizer.path={data / 'tokenizer.model'}",
        f"tokenizer.image_size={TILE_SIZE}",
        f"tokenizer.max_seq_len={MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={data / 'hf'}",
        "dataset._component_=tune.datasets.multimodal.the_cauldron_dataset",
        "dataset.subset=null",
        "dataset.source=json",
        f"dataset.data_files={data / 'train.json'}",
        "dataset.split=train",
        "batch_size=2",
        f"max_steps_per_epoch={steps}",
    ]


@functools.cache
def shared_assets() -> Path:
    """:func:`build_llama_vision_assets` once per test process, in a temporary directory removed at exit (the test
    modules of the vision configs share it)."""
    root = Path(tempfile.mkdtemp(prefix="tune-llama-vision-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ.setdefault("HF_DATASETS_CACHE", str(root / "hf_datasets_cache"))
    return build_llama_vision_assets(root / "assets")


def sharded_checkpoint(data: Path, num_shards: int) -> Path:
    """``data/hf_<num_shards>_shards/``: the tiny checkpoint split into ``model-0000k-of-0000n.safetensors`` files
    with ``model.safetensors.index.json``, as the released checkpoints are laid out (11B: 5 shards, 90B: 37), for
    configs that name their files by ``filename_format``/``max_filename``; written once per count."""
    from safetensors.torch import load_file, save_file

    out = data / f"hf_{num_shards}_shards"
    if (out / "model.safetensors.index.json").is_file():
        return out
    tensors = load_file(data / "hf" / "model.safetensors")
    keys = sorted(tensors)
    if len(keys) < num_shards:
        raise ValueError(f"{len(keys)} tensors cannot fill {num_shards} shards")
    partial = data / f".hf_{num_shards}_shards.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(data / "hf", partial, ignore=shutil.ignore_patterns("*.safetensors"))
    weight_map = {}
    for index in range(num_shards):
        name = f"model-{index + 1:05d}-of-{num_shards:05d}.safetensors"
        shard = {key: tensors[key] for key in keys[index::num_shards]}
        save_file(shard, partial / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    partial.rename(out)
    return out
