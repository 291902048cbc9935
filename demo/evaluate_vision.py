"""Held-out accuracy of a checkpoint on the vision demo's "what colour is the shape?" pictures.

    python demo/evaluate_vision.py CHECKPOINT_DIR --tokenizer TOKENIZER_MODEL --data HELDOUT_JSON [--label before]

Each row's picture and question go through the model transform as a prompt left open for the answer, and
``tune.generation.generate`` produces the answer's first token greedily with the picture as ``encoder_input``. Every
colour word is one token of the demo's tokenizer, so that token is the whole answer. Two numbers come out:

- accuracy: the colour whose token has the highest logit among the six colour words. A model that ignores the
  picture gets 1 in 6 on average, whatever else it has learnt.
- greedy answer: the greedy token over the whole vocabulary is the right colour word. A model with random weights
  gets few right, since it rarely says a colour at all.

It uses tune's public API the way a user's own script would: ``tune.models.from_hf`` loads the Hugging Face
checkpoint, ``gemma3_vision_transform`` and ``TheCauldronToMessages`` make the prompts, ``generate`` decodes.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from tune.data import TheCauldronToMessages
from tune.generation import generate
from tune.models import from_hf
from tune.models.gemma3_vision import gemma3_vision_transform

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vision_data.py, next to this file
from vision_data import COLOURS  # noqa: E402


@torch.inference_mode()
def evaluate(checkpoint_dir: str, tokenizer_path: str, data_path: str, batch_size: int = 100) -> dict:
    model = from_hf(checkpoint_dir, dtype=torch.float32).eval()
    hf_config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    transform = gemma3_vision_transform(
        tokenizer_path,
        image_size=hf_config["vision_config"]["image_size"],
        tokens_per_image=hf_config["mm_tokens_per_image"],
        image_token_id=hf_config["image_token_index"],
    )
    colours = list(COLOURS)
    colour_tokens = [transform.encode(colour, add_bos=False, add_eos=False) for colour in colours]
    if any(len(tokens) != 1 for tokens in colour_tokens):
        raise ValueError(f"Each colour word must be one token of {tokenizer_path}; got {colour_tokens}.")
    colour_ids = torch.tensor([tokens[0] for tokens in colour_tokens])
    to_messages = TheCauldronToMessages()
    rows = json.loads(Path(data_path).read_text())
    chosen, greedy, examples = 0, 0, []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        prompts, images = [], []
        for row in batch:
            messages = to_messages(row)["messages"][:-1]  # the question; the answer is what is asked for
            sample = transform({"messages": messages}, inference=True)
            prompts.append(sample["tokens"])
            images.append(sample["encoder_input"]["images"])
        # One token: the answer. (Generating on would feed a random model's own image-placeholder token back in.)
        tokens, logits = generate(
            model,
            prompts,
            max_generated_tokens=1,
            pad_id=transform.pad_id,
            temperature=0.0,
            encoder_input={"images": torch.cat(images)},
        )
        choices = logits[:, 0, colour_ids].argmax(dim=-1)  # [b]: the index of the likeliest colour
        for row, choice, token in zip(batch, choices.tolist(), tokens[:, -1].tolist()):
            expected = row["texts"][0]["assistant"]
            answer = transform.decode([token], skip_special_tokens=False)
            chosen += colours[choice] == expected
            greedy += answer == expected
            if len(examples) < 3:
                examples.append((Path(row["images"][0]).name, expected, answer))
    return {"chosen": chosen, "greedy": greedy, "total": len(rows), "examples": examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--label", default="model")
    args = parser.parse_args()
    result = evaluate(args.checkpoint_dir, args.tokenizer, args.data)
    chosen, greedy, total = result["chosen"], result["greedy"], result["total"]
    print(f"held-out accuracy ({args.label}): {chosen / total:.2f} ({chosen}/{total})  [likeliest colour word]")
    print(f"held-out greedy answer ({args.label}): {greedy / total:.2f} ({greedy}/{total})  [over all tokens]")
    for image, expected, answer in result["examples"]:
        print(f"  {image}: {answer!r} (expected {expected!r})")


if __name__ == "__main__":
    main()
