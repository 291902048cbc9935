"""Makes everything the offline demo needs, deterministically, from nothing but this file.

    python demo/make_demo.py OUT_DIR

writes
    OUT_DIR/data/train.json, OUT_DIR/data/heldout.json   list tasks as prompt/answer pairs (input, output)
    OUT_DIR/tokenizer/tokenizer.model                    a SentencePiece BPE tokenizer trained on that text
    OUT_DIR/base_model/                                  a small randomly initialised Llama-style model in
                                                         Hugging Face format (config.json + model.safetensors)

The tasks are small list manipulations (reverse, repeat, first item, last item, count) over a fixed vocabulary
of words, the list first and the question after it ("cyan red melon. What is the last item?"), so the model has
read the list by the time it learns what to do with it. Held-out samples use lists never seen in training, so
exact-match accuracy on them measures whether the model learned the tasks rather than memorised answers.
"""

import argparse
import json
import random
from pathlib import Path

WORDS = (
    "apple banana cherry grape lemon mango melon olive peach pear plum kiwi fig lime date "
    "red blue green gold pink gray black white cyan amber "
    "cat dog fox owl bee elk yak cow hen ram"
).split()
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

TASKS = {
    "Reverse the list.": lambda items: " ".join(reversed(items)),
    "Repeat the list.": lambda items: " ".join(items),
    "What is the first item?": lambda items: items[0],
    "What is the last item?": lambda items: items[-1],
    "How many items are in the list?": lambda items: NUMBER_WORDS[len(items)],
}

# The model: a Llama-3.2-shaped decoder small enough to train on two CPU cores in a couple of minutes.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def make_samples(num: int, rng: random.Random, exclude: set[tuple[str, ...]]) -> list[dict]:
    """``num`` samples over lists not in ``exclude`` (which grows, so train and held-out never share a list)."""
    samples = []
    while len(samples) < num:
        items = tuple(rng.sample(WORDS, rng.randint(3, 5)))
        if items in exclude:
            continue
        exclude.add(items)
        instruction = rng.choice(list(TASKS))
        samples.append({"input": f"{' '.join(items)}. {instruction}", "output": TASKS[instruction](list(items))})
    return samples


def train_tokenizer(texts: list[str], out_dir: Path) -> Path:
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out_dir / "tokenizer"),
        model_type="bpe",
        vocab_size=320,
        character_coverage=1.0,
        # Llama-2 special ids, so the llama2 tokenizer builder reads it as is
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    corpus.unlink()
    return out_dir / "tokenizer.model"


def make_base_model(vocab_size: int, out_dir: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from tune.models import to_hf_state_dict
    from tune.registry import family_for_hf_model_type

    config = dict(MODEL_CONFIG, vocab_size=vocab_size)
    torch.manual_seed(seed)
    model = family_for_hf_model_type(config["model_type"]).from_hf_config(config)
    # GPT-2/Llama-style initialisation (normal, std 0.02) so training from scratch is well conditioned
    for param in model.parameters():
        if param.dim() >= 2:
            torch.nn.init.normal_(param, mean=0.0, std=0.02)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_dict = {k: v.contiguous() for k, v in to_hf_state_dict(model, config).items()}
    save_file(state_dict, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--num-train", type=int, default=6000)
    parser.add_argument("--num-heldout", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    seen: set[tuple[str, ...]] = set()
    heldout = make_samples(args.num_heldout, rng, seen)
    train = make_samples(args.num_train, rng, seen)
    data_dir = args.out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "train.json").write_text(json.dumps(train, indent=0) + "\n")
    (data_dir / "heldout.json").write_text(json.dumps(heldout, indent=0) + "\n")

    # the llama2 chat format wraps each prompt in [INST] ... [/INST]: let those markers be pieces too
    texts = [f"[INST] {s['input']} [/INST] {s['output']}" for s in train]
    tokenizer_path = train_tokenizer(texts, args.out_dir / "tokenizer")
    import sentencepiece as spm

    vocab_size = spm.SentencePieceProcessor(model_file=str(tokenizer_path)).vocab_size()
    make_base_model(vocab_size, args.out_dir / "base_model", args.seed)
    print(f"demo assets in {args.out_dir}: {len(train)} train / {len(heldout)} held-out samples, vocab {vocab_size}")


if __name__ == "__main__":
    main()
