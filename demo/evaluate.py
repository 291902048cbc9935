"""Exact-match accuracy of a checkpoint on the demo's held-out prompts (greedy decoding, batched).

    python demo/evaluate.py CHECKPOINT_DIR --tokenizer TOKENIZER_MODEL --data HELDOUT_JSON [--label before]

It uses tune's public API the way a user's own script would: ``tune.models.from_hf`` loads the Hugging Face
checkpoint, the family's tokenizer formats the prompts, ``tune.generation.generate`` decodes.
"""

import argparse
import json
from collections import defaultdict

import torch

from tune.data import Message
from tune.generation import generate
from tune.models import from_hf
from tune.models.llama2 import llama2_tokenizer


@torch.inference_mode()
def evaluate(checkpoint_dir: str, tokenizer_path: str, data_path: str, batch_size: int = 50) -> dict:
    model = from_hf(checkpoint_dir).eval()
    tokenizer = llama2_tokenizer(tokenizer_path)
    samples = json.loads(open(data_path).read())
    per_task: dict[str, list[bool]] = defaultdict(list)
    examples = []
    for start in range(0, len(samples), batch_size):
        batch = samples[start : start + batch_size]
        prompts = [
            tokenizer.tokenize_messages([Message(role="user", content=s["input"])], add_end_tokens=False)[0]
            for s in batch
        ]
        tokens, _ = generate(
            model,
            prompts,
            max_generated_tokens=16,
            pad_id=tokenizer.pad_id,
            temperature=0.0,
            stop_tokens=tokenizer.stop_tokens,
        )
        generated = tokens[:, max(map(len, prompts)) :]  # after the left-padded prompts
        for sample, row in zip(batch, generated.tolist()):
            stop = next((i for i, t in enumerate(row) if t in tokenizer.stop_tokens), len(row))
            answer = tokenizer.decode(row[:stop]).strip()
            task = sample["input"].split(". ", 1)[1]  # "<list>. <instruction>"
            per_task[task].append(answer == sample["output"])
            if len(examples) < 3:
                examples.append((sample["input"], sample["output"], answer))
    correct = sum(sum(v) for v in per_task.values())
    return {
        "accuracy": correct / len(samples),
        "per_task": {k: sum(v) / len(v) for k, v in sorted(per_task.items())},
        "examples": examples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--label", default="model")
    args = parser.parse_args()
    result = evaluate(args.checkpoint_dir, args.tokenizer, args.data)
    print(f"\n[{args.label}] held-out exact match: {result['accuracy']:.1%}")
    for task, accuracy in result["per_task"].items():
        print(f"  {task:<32} {accuracy:.1%}")
    for prompt, expected, answer in result["examples"]:
        print(f"  {prompt!r} -> {answer!r} (expected {expected!r})")


if __name__ == "__main__":
    main()
