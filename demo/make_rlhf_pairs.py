"""Preference pairs for the RLHF demo's reward model, on the counting task ("How many items are in the list?").

    python demo/make_rlhf_pairs.py SFT_CHECKPOINT_DIR --assets ASSETS_DIR [--samples 4]

writes ASSETS_DIR/data/pairs_train.json (from the training rows) and ASSETS_DIR/data/pairs_heldout.json (from the
held-out rows), in the messages format of ``tune.datasets.preference_dataset``: each row has a ``chosen`` and a
``rejected`` conversation, the same user turn (the prompt) and different assistant turns.

The chosen answer is the right one. The rejected answers are the supervised model's own wrong answers, sampled
at temperature 1 (the way GRPO samples), plus one wrong count ("four" for a list of three) per prompt. GRPO
scores what the policy samples: a reward model that has seen only hand-made mistakes has never been asked about
the policy's own ("red", "three three") and could rank those above the right answer, which
GRPO would then learn. The wrong count keeps every prompt's pairs about counting when the model's samples are all
right, and adds the mistake that is hardest to tell from the answer.
"""

import argparse
import json
import random
from pathlib import Path

import torch

from tune.data import Message
from tune.generation import generate
from tune.models import from_hf
from tune.models.llama2 import llama2_tokenizer

COUNT_TASK = "How many items are in the list?"
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@torch.inference_mode()
def sample_answers(
    model, tokenizer, prompts: list[str], samples: int, seed: int, batch_size: int = 64
) -> list[list[str]]:
    """``samples`` answers of the model to each prompt, sampled at temperature 1."""
    torch.manual_seed(seed)
    rng = torch.Generator().manual_seed(seed)
    repeated = [prompt for prompt in prompts for _ in range(samples)]
    answers = []
    for start in range(0, len(repeated), batch_size):
        batch = [
            tokenizer.tokenize_messages([Message(role="user", content=p)], add_end_tokens=False)[0]
            for p in repeated[start : start + batch_size]
        ]
        tokens, _ = generate(
            model,
            batch,
            max_generated_tokens=12,
            pad_id=tokenizer.pad_id,
            temperature=1.0,
            stop_tokens=tokenizer.stop_tokens,
            rng=rng,
        )
        for row in tokens[:, max(map(len, batch)) :].tolist():
            stop = next((i for i, t in enumerate(row) if t in tokenizer.stop_tokens), len(row))
            answers.append(tokenizer.decode(row[:stop]).strip())
    return [answers[i : i + samples] for i in range(0, len(answers), samples)]


def make_pairs(rows: list[dict], sampled: list[list[str]], rng: random.Random) -> list[dict]:
    """Pairs of each row: its right answer against each distinct wrong sampled answer and one wrong count."""
    pairs = []
    for row, answers in zip(rows, sampled, strict=True):
        right = row["output"]
        # distinct, in sampled order; an empty answer cannot be a preference row's turn (its content must be text)
        wrong = list(dict.fromkeys(a for a in answers if a and a != right))
        count = len(row["input"].split(". ", 1)[0].split())
        wrong_count = NUMBER_WORDS[rng.choice([n for n in (3, 4, 5) if n != count])]
        if wrong_count not in wrong:
            wrong.append(wrong_count)
        user = {"role": "user", "content": row["input"]}
        for answer in wrong:
            pairs.append(
                {
                    "chosen": [user, {"role": "assistant", "content": right}],
                    "rejected": [user, {"role": "assistant", "content": answer}],
                }
            )
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_dir", help="the supervised model, whose wrong answers are the rejected ones")
    parser.add_argument("--assets", required=True, type=Path, help="written by demo/make_demo.py")
    parser.add_argument("--samples", type=int, default=4, help="answers sampled per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = from_hf(args.checkpoint_dir).eval()
    tokenizer = llama2_tokenizer(str(args.assets / "tokenizer" / "tokenizer.model"))
    rng = random.Random(args.seed)
    for split, out_name in (("train", "pairs_train.json"), ("heldout", "pairs_heldout.json")):
        rows = json.loads((args.assets / "data" / f"{split}.json").read_text())
        rows = [row for row in rows if row["input"].endswith(COUNT_TASK)]
        sampled = sample_answers(model, tokenizer, [row["input"] for row in rows], args.samples, args.seed)
        pairs = make_pairs(rows, sampled, rng)
        (args.assets / "data" / out_name).write_text(json.dumps(pairs, indent=0) + "\n")
        num_right = sum(a == row["output"] for row, answers in zip(rows, sampled) for a in answers)
        print(
            f"{split}: {len(pairs)} pairs from {len(rows)} counting prompts "
            f"(the model's samples: {num_right / max(1, len(rows) * args.samples):.1%} right)"
        )


if __name__ == "__main__":
    main()
