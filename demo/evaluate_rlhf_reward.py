"""Held-out pair accuracy of the RLHF demo's reward model: the share of pairs whose chosen answer it scores higher.

    python demo/evaluate_rlhf_reward.py REWARD_CHECKPOINT_DIR --tokenizer TOKENIZER_MODEL --pairs PAIRS_JSON

It scores with ``tune.rlhf.RewardModelReward``, the reward function GRPO calls in the demo's next stage, so the
accuracy printed is that of the rewards GRPO gets. Pairs whose rejected answer is a number word (a wrong count,
the mistake closest to the answer) are also counted on their own.
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from tune.models.llama2 import llama2_classifier, llama2_tokenizer
from tune.rlhf import RewardModelReward
from tune.training import FullModelHFCheckpointer

NUMBER_WORDS = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}


def load_reward(checkpoint_dir: Path, tokenizer_path: str, output_dir: str) -> RewardModelReward:
    config = json.loads((checkpoint_dir / "config.json").read_text())
    model = llama2_classifier(
        num_classes=1,
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        embed_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_seq_len=config["max_position_embeddings"],
        norm_eps=config["rms_norm_eps"],
    )
    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=checkpoint_dir, checkpoint_files=None, model_type="REWARD", output_dir=output_dir
    )
    tokenizer = llama2_tokenizer(tokenizer_path, max_seq_len=128, prompt_template="tune.data.Llama2ChatFormat")
    return RewardModelReward(model, tokenizer, checkpointer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--pairs", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as unused:  # the checkpointer's output_dir: nothing is written there
        reward = load_reward(args.checkpoint_dir, args.tokenizer, unused)
    pairs = json.loads(Path(args.pairs).read_text())
    prompts = [pair["chosen"][0]["content"] for pair in pairs]
    chosen = reward(prompts, [pair["chosen"][1]["content"] for pair in pairs])
    rejected_texts = [pair["rejected"][1]["content"] for pair in pairs]
    rejected = reward(prompts, rejected_texts)
    right = chosen > rejected
    counts = torch.tensor([text in NUMBER_WORDS for text in rejected_texts])
    print(f"\n[reward model] held-out pair accuracy: {right.float().mean().item():.1%} ({len(pairs)} pairs)")
    print(f"  rejected a wrong count: {right[counts].float().mean().item():.1%} ({int(counts.sum())} pairs)")
    print(f"  rejected anything else: {right[~counts].float().mean().item():.1%} ({int((~counts).sum())} pairs)")
    print(f"  mean reward: chosen {chosen.mean().item():.2f}, rejected {rejected.mean().item():.2f}")


if __name__ == "__main__":
    main()
