"""Makes everything the offline vision-language demo needs, deterministically, from nothing but this folder.

    python demo/make_demo_vision.py OUT_DIR

writes
    OUT_DIR/data/train.json, OUT_DIR/data/heldout.json   "what colour is the shape?" rows in The Cauldron's layout
    OUT_DIR/data/images_train/, OUT_DIR/data/images_heldout/   their pictures (demo/vision_data.py draws them)
    OUT_DIR/tokenizer/tokenizer.model                    a Gemma-style SentencePiece model trained on the task's
                                                         text, with Gemma 3's turn and image markers as pieces
    OUT_DIR/base_model/                                  a tiny randomly initialised Gemma 3 with images (SigLIP,
                                                         projector, language model) in Hugging Face's
                                                         Gemma3ForConditionalGeneration format

Train and held-out rows come from different seeds, so every held-out picture is new (its colour, shape, place, size
and background noise drawn afresh). The question is the same in every row, so a model that does not look at the
image can do no better than guess one of the six colours (1 in 6). Every colour word is one token of the
tokenizer, so the answer is one token (demo/evaluate_vision.py relies on it).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vision_data.py, next to this file
from vision_data import COLOURS, QUESTION, write_colour_task  # noqa: E402

IMAGE_SIZE = 32
# One image token per SigLIP patch (4 x 4 patches of 8 pixels), no pooling: with the grid pooled 2 x 2 into 4 tokens,
# some runs stalled at four colours of six for hundreds of steps.
TOKENS_PER_IMAGE = 16
# Gemma's special pieces: pad 0, eos 1, bos 2, unk 3, then the turn and image markers
CONTROL_PIECES = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]

# The model: Gemma 3 with images, shrunk until it trains on two CPU cores in seconds. Its image token id and
# vocabulary size are set from the tokenizer (the image token is the first id after the SentencePiece pieces, as in
# the releases).
TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "max_position_embeddings": 128,
    "sliding_window": 64,
    "sliding_window_pattern": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "tie_word_embeddings": True,
}
VISION_CONFIG = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": IMAGE_SIZE,
    "patch_size": 8,
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}


def rendered_texts(rows: list[dict]) -> list[str]:
    """Each row as Gemma 3's chat format writes it, with its image markers: what the tokenizer will be asked to
    encode, so every piece of it is learnt."""
    texts = []
    for row in rows:
        for turn in row["texts"]:
            texts.append(
                f"<start_of_turn>user\n\n\n<start_of_image><end_of_image>\n\n{turn['user']}<end_of_turn>\n"
                f"<start_of_turn>model\n{turn['assistant']}<end_of_turn>\n"
            )
    return texts


def train_tokenizer(texts: list[str], out_dir: Path) -> Path:
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(out_dir / "tokenizer"),
        model_type="bpe",
        vocab_size=128,
        hard_vocab_limit=False,  # the text is a handful of words: take as many pieces as it has, up to 128
        character_coverage=1.0,
        # Gemma's settings: no dummy space before the text, whitespace and newlines kept as they are
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        byte_fallback=False,
        user_defined_symbols=CONTROL_PIECES,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        num_threads=1,
        minloglevel=2,
    )
    return out_dir / "tokenizer.model"


def hf_config(tokenizer_path: Path) -> dict:
    """``config.json`` of the model for the tokenizer at ``tokenizer_path``."""
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    num_pieces = pieces.vocab_size()
    image_token_id = num_pieces  # the first id after the pieces, as Gemma 3's 262144
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": dict(TEXT_CONFIG, vocab_size=num_pieces + 1),
        "vision_config": VISION_CONFIG,
        "mm_tokens_per_image": TOKENS_PER_IMAGE,
        "boi_token_index": pieces.piece_to_id("<start_of_image>"),
        "eoi_token_index": pieces.piece_to_id("<end_of_image>"),
        "image_token_index": image_token_id,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def make_base_model(config: dict, out_dir: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from tune.models import to_hf_state_dict
    from tune.registry import family_for_hf_model_type

    torch.manual_seed(seed)
    model = family_for_hf_model_type(config["model_type"]).from_hf_config(config)
    # The language model's matrices normal with std 0.02 (Gemma's initializer_range); the vision tower keeps
    # PyTorch's default layer initialisation. The projection is built as zeros (as transformers builds it), which
    # would leave the vision tower without a gradient at first: normal with std 1 / sqrt(vision width) makes image
    # tokens start near unit scale, and training from scratch finds the picture within a few dozen steps.
    for param in model.decoder.parameters():
        if param.dim() >= 2:
            torch.nn.init.normal_(param, mean=0.0, std=0.02)
    torch.nn.init.normal_(model.projector.projection, mean=0.0, std=config["vision_config"]["hidden_size"] ** -0.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_dict = {key: value.contiguous() for key, value in to_hf_state_dict(model, config).items()}
    save_file(state_dict, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--num-train", type=int, default=3000)
    parser.add_argument("--num-heldout", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    data_dir = args.out_dir / "data"
    write_colour_task(data_dir, args.num_train, seed=args.seed, image_size=IMAGE_SIZE, name="train")
    write_colour_task(data_dir, args.num_heldout, seed=args.seed + 1, image_size=IMAGE_SIZE, name="heldout")
    # The tokenizer learns the six conversations the rows can hold, each once: the same pieces whatever the number of
    # rows or the seed, so the vocabulary size in configs/demo/vision_full_single_device.yaml always holds.
    every_answer = [{"texts": [{"user": QUESTION, "assistant": colour}]} for colour in COLOURS]
    config = hf_config(train_tokenizer(rendered_texts(every_answer), args.out_dir / "tokenizer"))
    make_base_model(config, args.out_dir / "base_model", args.seed)
    print(
        f"vision demo assets in {args.out_dir}: {args.num_train} train / {args.num_heldout} held-out images "
        f"({IMAGE_SIZE} px), image token id {config['image_token_index']} after the tokenizer's pieces"
    )


if __name__ == "__main__":
    main()
