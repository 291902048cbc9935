"""Writes docs/models.md: every built-in model family's released sizes with their parameter counts, Hugging Face
repos, and the shipped configs (and the recipes that run them) for each size.

Everything on the page is read from the code: the sizes are the families' ``MODEL_SIZES`` tables (through the
registry's ``ModelFamily.sizes``), each parameter count is that of the size's builder run on the meta device
(no memory, no weights; a tied weight counts once), and a config trains a size when one of its ``_component_``
entries names the size's builder or its ``lora_``/``qlora_`` variant. The recipe of a config is the built-in recipe
whose ``RECIPE_INFO`` globs claim it (``tune.config.recipes_for_config``).

    python tools/models_table.py           # rewrite docs/models.md
    python tools/models_table.py --check   # exit 1 when docs/models.md differs from what this writes

tests/test_docs_models.py runs the check.
"""

import importlib
import logging
import pkgutil
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the families and configs of this checkout, whichever tune is installed

import tune.models  # noqa: E402
from tune.config import builtin_configs, builtin_recipes, recipes_for_config  # noqa: E402
from tune.registry import SHARED_COMPONENT_PACKAGES, ModelFamily, get_model_family  # noqa: E402

PAGE = ROOT / "docs" / "models.md"
_COMPONENT = re.compile(r"tune\.models\.(\w+)\.(\w+)")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

HEADER = """\
<!-- Written by tools/models_table.py from the model families and configs/; edit those, not this page. -->
# Models

Every model family tune ships, with its released sizes. For each size: its builder (`tune.models.<family>.<size>`,
with `lora_<size>` and, where the family has one, `qlora_<size>` next to it), the exact number of parameters of the
model the builder makes (counted on PyTorch's meta device; a weight shared by the embedding and the output layer
counts once; a mixture of experts counts every expert, a vision-language model its vision encoder too), the
Hugging Face repository whose `config.json` the dimensions are, and the shipped configs that build it, under the
recipe that runs each one. `tune ls --models` lists the families and all their builders, `tune ls` the recipes and
configs.

To train a size, download its repository (`tune download REPO` writes it to `/tmp/<repo name>`, where the shipped
configs look) and run a config: `tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device`.
A size without a config of its own trains with a config of another size of the family once `model`,
`tokenizer.path`, `checkpointer.checkpoint_dir` and `output_dir` are changed (`tune cp` the config, then edit it).
[memory_and_speed.md](memory_and_speed.md) says what each memory knob saves, [gpu_quickstart.md](gpu_quickstart.md)
runs a first fine-tune on a GPU.
"""


def builtin_family_names() -> list[str]:
    """The built-in families: the public subpackages of ``tune.models`` that are not shared components."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(tune.models.__path__)
        if m.ispkg and not m.name.startswith("_") and m.name not in SHARED_COMPONENT_PACKAGES
    )


def count_parameters(builder: Any) -> int:
    """The parameters of the model ``builder()`` makes, built on the meta device; a shared parameter counts once."""
    logger = logging.getLogger("tune.models")
    level = logger.level
    logger.setLevel(logging.ERROR)  # a builder's advice for training (phi3_mini_128k's RoPE factors) is noise here
    try:
        with torch.device("meta"):
            model = builder()
    finally:
        logger.setLevel(level)
    return sum(p.numel() for p in model.parameters())


def family_title(name: str) -> str:
    """The family's name as its package docstring gives it (``Llama 3.2 (text)``), else the package name."""
    first_line = (importlib.import_module(f"tune.models.{name}").__doc__ or "").strip().split("\n", 1)[0]
    depth = 0
    for index, char in enumerate(first_line):  # the first colon outside parentheses ends the name
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ":" and depth == 0:
            return first_line[:index].strip() or name
    return name


def _components(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_component_" and isinstance(value, str):
                yield value.split("#", 1)[0].strip()
            else:
                yield from _components(value)
    elif isinstance(node, list):
        for value in node:
            yield from _components(value)


def _size_of(component: str, families: dict[str, ModelFamily]) -> tuple[str, str] | None:
    """``(family, size)`` when ``component`` names a size's builder or its lora_/qlora_ variant."""
    match = _COMPONENT.fullmatch(component)
    if match is None or match.group(1) not in families:
        return None
    family = families[match.group(1)]
    builder = match.group(2)
    if builder not in family.builders:
        return None
    size = re.sub(r"^q?lora_", "", builder)
    return (family.name, size) if size in family.sizes else None


def configs_by_size(families: dict[str, ModelFamily]) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``(family, size)`` -> recipe -> the names of the built-in configs that build that size, sorted."""
    recipes = list(builtin_recipes().values())
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for name, path in builtin_configs().items():
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)
        sizes = {size for component in _components(tree) if (size := _size_of(component, families))}
        if not sizes:
            continue
        runners = [r.name for r in recipes_for_config(name, recipes)] or ["(no recipe)"]
        for size in sizes:
            for recipe in runners:
                found.setdefault(size, {}).setdefault(recipe, []).append(name)
    return found


def _format_count(count: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6)):
        if count >= scale:
            return f"{count:,} ({count / scale:.2f}{unit})"
    return f"{count:,}"


def _configs_cell(by_recipe: dict[str, list[str]]) -> str:
    if not by_recipe:
        return "–"
    return "; ".join(
        f"`{recipe}`: " + ", ".join(f"`{c}`" for c in sorted(names)) for recipe, names in sorted(by_recipe.items())
    )


def render() -> str:
    """The whole page."""
    families = {name: get_model_family(name) for name in builtin_family_names()}
    configs = configs_by_size(families)
    num_sizes = sum(len(f.sizes) for f in families.values())
    num_configs = len({c for by_recipe in configs.values() for names in by_recipe.values() for c in names})
    lines = [
        HEADER,
        f"{len(families)} families, {num_sizes} sizes, {num_configs} configs that build one of them.",
        "",
    ]
    for name, family in families.items():
        lines += [
            f"## `{name}`: {family_title(name)}",
            "",
            "| size (builder) | parameters | Hugging Face repo | recipe: configs |",
            "|---|---|---|---|",
        ]
        for size, spec in family.sizes.items():
            params = _format_count(count_parameters(family.builders[size]))
            repo = f"[{spec.repo}](https://huggingface.co/{spec.repo})"
            lines.append(f"| `{size}` | {params} | {repo} | {_configs_cell(configs.get((name, size), {}))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    wanted = render()
    current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else None
    if "--check" in argv:
        if current == wanted:
            return 0
        print("docs/models.md is stale: run python tools/models_table.py", file=sys.stderr)
        return 1
    PAGE.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
