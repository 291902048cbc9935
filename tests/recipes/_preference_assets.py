"""Generated preference pairs for the DPO recipe tests (nothing is downloaded).

The task: a prompt names a number word ("one" .. "nine") among filler words and asks for the next one; the chosen
answer is the next number word, the rejected answer another number word. The rule is learnable by a tiny model
(nine prompts' worth of facts), and held-out pairs (new filler, new rejected answers) measure whether the model
came to prefer the chosen answers.
"""

import json
import random
from pathlib import Path

NUMBERS = "one two three four five six seven eight nine ten".split()
FILLER = "the a color red blue green list task write input response describes that context".split()


def preference_rows(num_pairs: int, seed: int) -> list[dict]:
    """``num_pairs`` rows ``{"prompt", "chosen", "rejected"}`` of plain strings."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_pairs):
        index = rng.randrange(9)
        filler = " ".join(rng.choice(FILLER) for _ in range(rng.randrange(1, 6)))
        wrong = rng.choice([w for w in NUMBERS if w != NUMBERS[index + 1]])
        rows.append(
            {
                "prompt": f"{filler} what number is after {NUMBERS[index]}",
                "chosen": f"{NUMBERS[index + 1]}",
                "rejected": wrong,  # one word, as the chosen answer: length alone tells nothing
            }
        )
    return rows


def write_preference_messages(path: Path, num_pairs: int, seed: int) -> Path:
    """A JSON file for ``tune.datasets.preference_dataset``: ``chosen`` and ``rejected`` lists of messages."""
    rows = []
    for row in preference_rows(num_pairs, seed):
        user = {"role": "user", "content": row["prompt"]}
        rows.append(
            {
                "chosen": [user, {"role": "assistant", "content": row["chosen"]}],
                "rejected": [user, {"role": "assistant", "content": row["rejected"]}],
            }
        )
    path.write_text(json.dumps(rows))
    return path
