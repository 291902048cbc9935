"""Tiny assets of the Gemma 3 vision recipe tests (tests/recipes/test_vision_gemma3.py), built in code:

- ``hf/``: a ``transformers.Gemma3ForConditionalGeneration`` with the 4B release's settings (tied embeddings,
  local and global layers, linear RoPE scaling on the global ones, SigLIP without a head) at tiny dimensions,
  random weights spread wide (norms and biases too), saved with ``save_pretrained``, and its ``tokenizer.model``;
- ``tokenizer.model``: a tiny Gemma-style SentencePiece model holding Gemma 3's turn and image markers; the image
  token is the first id after its vocabulary, as ``<image_soft_token>`` is in the releases;
- ``train.json``: the colour task of demo/vision_data.py at the tiny model's image size, in The Cauldron's layout.
"""

import json
import shutil
from pathlib import Path

import torch

from demo.vision_data import COLOURS, QUESTION, write_colour_task
from tests.tune.data._tiny_tokenizers import corpus

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

SPM_VOCAB = 480
IMAGE_TOKEN_ID = SPM_VOCAB  # the first id after the SentencePiece vocabulary, as 262144 in the releases
VOCAB_SIZE = 512  # the embedding table, padded past the image token (262208 in the releases)
IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_IMAGE = 32, 8, 4  # a 4 x 4 grid of patches pooled 2 x 2 into 4 image tokens
MAX_SEQ_LEN = 128
# 2 local layers then a global one (the releases: 5 then 1); a window shorter than the ~30-token samples
TEXT_DIMS = dict(
    num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, embed_dim=64, intermediate_dim=128,
    sliding_window_size=8, sliding_window_pattern=3, query_pre_attn_scalar=16,
)  # fmt: skip
VISION_DIMS = dict(vision_embed_dim=32, vision_num_layers=2, vision_num_heads=2, vision_intermediate_dim=64)
# 4 steps of 2 x 8 samples on one device, or of 2 ranks x 2 x 8: 128 rows cover both
NUM_ROWS = 128


def _train_tokenizer(path: Path) -> None:
    import sentencepiece as spm

    lines = [*corpus(), *(f"{QUESTION} {colour}" for colour in COLOURS for _ in range(20))]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path.with_suffix("")), vocab_size=SPM_VOCAB,
        model_type="bpe", byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, character_coverage=1.0,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"],
        minloglevel=2, num_threads=1, pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>", eos_piece="<eos>",
        pad_piece="<pad>",
    )  # fmt: skip


def hf_config(tokenizer_path: Path):
    """The tiny ``Gemma3Config``: google/gemma-3-4b-it's settings (rope thetas, linear factor 8 on the global
    layers, query_pre_attn_scalar = head_dim, tied embeddings, no vision head) at the tiny dimensions."""
    import sentencepiece as spm
    import transformers

    pieces = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    text = dict(
        vocab_size=VOCAB_SIZE, hidden_size=TEXT_DIMS["embed_dim"], intermediate_size=TEXT_DIMS["intermediate_dim"],
        num_hidden_layers=TEXT_DIMS["num_layers"], num_attention_heads=TEXT_DIMS["num_heads"],
        num_key_value_heads=TEXT_DIMS["num_kv_heads"], head_dim=TEXT_DIMS["head_dim"],
        max_position_embeddings=MAX_SEQ_LEN, sliding_window=TEXT_DIMS["sliding_window_size"],
        sliding_window_pattern=TEXT_DIMS["sliding_window_pattern"],
        query_pre_attn_scalar=TEXT_DIMS["query_pre_attn_scalar"], rms_norm_eps=1e-6,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        bos_token_id=pieces.bos_id(), eos_token_id=pieces.eos_id(), pad_token_id=pieces.pad_id(),
    )  # fmt: skip
    vision = dict(
        hidden_size=VISION_DIMS["vision_embed_dim"], intermediate_size=VISION_DIMS["vision_intermediate_dim"],
        num_hidden_layers=VISION_DIMS["vision_num_layers"], num_attention_heads=VISION_DIMS["vision_num_heads"],
        image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, vision_use_head=False, layer_norm_eps=1e-6,
    )  # fmt: skip
    return transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=pieces.piece_to_id("<start_of_image>"), eoi_token_index=pieces.piece_to_id("<end_of_image>"),
        image_token_index=IMAGE_TOKEN_ID, tie_word_embeddings=True,
    )  # fmt: skip


def _save_hf_model(config, path: Path) -> None:
    """Random weights, every one spread: matrices N(0, 0.08); Gemma's RMSNorm offsets and the biases N(0, 0.1);
    SigLIP's LayerNorm scales 1 + N(0, 0.1) (the initialisation leaves norms trivial and biases zero)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
            elif "vision_tower" in name and "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
    model.save_pretrained(path, safe_serialization=True)


def build_assets(root: Path) -> Path:
    """Writes ``tokenizer.model``, ``hf/`` (checkpoint, config and a copy of the tokenizer) and ``train.json``
    (with ``images_train/``) into ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(root / "tokenizer.model")
    _save_hf_model(hf_config(root / "tokenizer.model"), root / "hf")
    shutil.copyfile(root / "tokenizer.model", root / "hf" / "tokenizer.model")
    write_colour_task(root, NUM_ROWS, seed=0, image_size=IMAGE_SIZE, name="train")
    return root


def model_overrides(builder: str, quantize: bool = False) -> list[str]:
    """``model.*``: the family's component builder (``gemma3_vision`` or ``lora_gemma3_vision``) with the tiny
    dimensions; the config's trainable choices and LoRA settings are kept."""
    overrides = [f"model._component_=tune.models.gemma3_vision.{builder}"]
    if quantize:  # what a qlora_* builder adds to lora_*
        overrides.append("model.quantize_base=True")
    dims = dict(
        vocab_size=VOCAB_SIZE, max_seq_len=MAX_SEQ_LEN, **TEXT_DIMS, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE,
        **VISION_DIMS, mm_tokens_per_image=TOKENS_PER_IMAGE, image_token_id=IMAGE_TOKEN_ID,
    )  # fmt: skip
    return [*overrides, *(f"model.{key}={json.dumps(value)}" for key, value in dims.items())]


def run_overrides(root: Path, builder: str, out: Path, steps: int, quantize: bool = False) -> list[str]:
    """Command-line changes that run a shipped Gemma 3 vision config at tiny scale on the CPU: the tiny model,
    tokenizer (its image settings) and checkpoint, the colour task, fp32, ``steps`` steps of 2 samples."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *model_overrides(builder, quantize),
        f"tokenizer.path={root / 'tokenizer.model'}",
        f"tokenizer.image_size={IMAGE_SIZE}",
        f"tokenizer.tokens_per_image={TOKENS_PER_IMAGE}",
        f"tokenizer.image_token_id={IMAGE_TOKEN_ID}",
        f"checkpointer.checkpoint_dir={root / 'hf'}",
        "dataset._component_=tune.datasets.multimodal.the_cauldron_dataset",
        "dataset.subset=null",
        "dataset.source=json",
        f"dataset.data_files={root / 'train.json'}",
        "dataset.split=train",
        "batch_size=2",
        f"max_steps_per_epoch={steps}",
    ]


def transform(root: Path):
    """The model transform the runs use, built in this process."""
    from tune.models.gemma3_vision import gemma3_vision_transform

    return gemma3_vision_transform(
        str(root / "tokenizer.model"), image_size=IMAGE_SIZE, tokens_per_image=TOKENS_PER_IMAGE,
        image_token_id=IMAGE_TOKEN_ID,
    )  # fmt: skip


def image_batch(root: Path, num_rows: int = 4) -> dict:
    """The first ``num_rows`` samples of the colour task, collated as the recipes collate them (padded, images
    joined), plus ``attention_mask`` and ``token_type_ids`` for ``Gemma3ForConditionalGeneration``."""
    from tune.data import padded_collate_images
    from tune.datasets.multimodal import the_cauldron_dataset

    dataset = the_cauldron_dataset(
        transform(root), subset=None, source="json", data_files=str(root / "train.json"), split="train"
    )
    samples = [dataset[i] for i in range(num_rows)]
    batch = padded_collate_images(samples)
    attention_mask = torch.zeros_like(batch["tokens"])
    for row, sample in enumerate(samples):
        attention_mask[row, : len(sample["tokens"])] = 1
    batch["attention_mask"] = attention_mask
    batch["token_type_ids"] = (batch["tokens"] == IMAGE_TOKEN_ID).long()
    return batch


def config_path(name: str) -> Path:
    """configs/<name>.yaml."""
    return CONFIGS_DIR / f"{name}.yaml"
