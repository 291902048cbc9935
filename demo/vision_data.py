"""An offline image task for vision-language runs: what colour is the shape?

Each image is a small picture of one shape (square, disc or bar) in one of six colours, at a random place and size
on a noisy light background; the question asks for the shape's colour and the answer is one word. A text-only model
is at chance (1 in 6); a model that reads the image can answer every question. The rows are in The Cauldron's
layout (``images``: a list of image paths, ``texts``: a list of ``{"user", "assistant"}`` turns), so
``tune.datasets.multimodal.the_cauldron_dataset`` reads them with ``source=json``.

    python demo/vision_data.py OUT_DIR [--num-rows N] [--seed S]
"""

import argparse
import json
import random
from pathlib import Path

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 215, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
SHAPES = ("square", "disc", "bar")
QUESTION = "What colour is the shape?"


def draw(colour: str, shape: str, size: int, rng: random.Random):
    """One ``size`` x ``size`` RGB picture of ``shape`` in ``colour`` on a noisy light background."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size))
    image.putdata([tuple(rng.randint(200, 255) for _ in range(3)) for _ in range(size * size)])
    side = rng.randint(size // 3, size // 2)
    left, top = rng.randint(0, size - side), rng.randint(0, size - side)
    box = (left, top, left + side - 1, top + side - 1)
    pen = ImageDraw.Draw(image)
    fill = COLOURS[colour]
    if shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "disc":
        pen.ellipse(box, fill=fill)
    else:  # a bar: a third as high as it is wide
        pen.rectangle((left, top, left + side - 1, top + max(side // 3, 2)), fill=fill)
    return image


def write_colour_task(
    out_dir: Path, num_rows: int, *, seed: int = 0, image_size: int = 32, name: str = "train"
) -> Path:
    """Writes ``num_rows`` images under ``out_dir/images_<name>/`` and their rows to ``out_dir/<name>.json``.

    Args:
        out_dir (Path): where to write.
        num_rows (int): how many image-question-answer rows.
        seed (int): the random seed (colours, shapes, places, noise).
        image_size (int): side of the square images, in pixels.
        name (str): the file name stem (``train``, ``heldout``).

    Returns:
        Path: the JSON file (a list of rows with absolute image paths).
    """
    rng = random.Random(seed)
    image_dir = out_dir / f"images_{name}"
    image_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(num_rows):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        path = image_dir / f"{index:05d}.png"
        draw(colour, shape, image_size, rng).save(path)
        rows.append({"images": [str(path.resolve())], "texts": [{"user": QUESTION, "assistant": colour}]})
    out = out_dir / f"{name}.json"
    out.write_text(json.dumps(rows, indent=0) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--num-rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_colour_task(args.out_dir, args.num_rows, seed=args.seed))


if __name__ == "__main__":
    main()
