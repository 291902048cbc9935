"""Writes the README's table of which training recipe supports which option, from what the recipes declare.

A training recipe is a shipped recipe whose ``RECIPE_INFO["optional_keys"]`` names the ``"finetune"`` table. It
refuses an option when its ``UNSUPPORTED`` table names the option's key, and the distributed recipes (those that
call ``config.check_training_config(..., distributed=True)``) refuse ``optimizer_in_bwd``, as tune.config does.
Both are read from the recipe files with ``ast``: no recipe is imported, and neither is torch.

    python tools/recipe_table.py           # rewrite the table between the README's markers
    python tools/recipe_table.py --check   # exit 1 when the README's table differs from the recipes

tests/test_readme.py runs the check.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the recipes and tune.config of this checkout, whichever tune is installed

from tune.config import builtin_recipes, read_recipe_info, read_unsupported  # noqa: E402

README = ROOT / "README.md"
START = "<!-- recipe-table:start (written by tools/recipe_table.py; edit the recipes, not this table) -->"
END = "<!-- recipe-table:end -->"
# column title -> the config key the recipes' UNSUPPORTED tables name
OPTIONS = {
    "grad. accumulation": "gradient_accumulation_steps",
    "`optimizer_in_bwd`": "optimizer_in_bwd",
    "act. checkpointing": "enable_activation_checkpointing",
    "act. offloading": "enable_activation_offloading",
    "`compile`": "compile",
    "packing": "dataset.packed",
    "validation": "dataset_val",
    "`collate_fn`": "collate_fn",
    "`model_converters`": "model_converters",
    "`finetuning_schedule`": "finetuning_schedule",
    "tensor parallel": "tensor_parallel_dim",
    "context parallel": "context_parallel_dim",
}
# keys of the "distributed" table: no column for single-device recipes
_DISTRIBUTED_ONLY = {"tensor_parallel_dim", "context_parallel_dim"}
_DISTRIBUTED_REASON = "FSDP2 already shards the optimizer state across ranks"


def _checks_as_distributed(path: Path) -> bool:
    """Whether the recipe calls ``check_training_config(..., distributed=True)``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == (
            "check_training_config"
        ):
            return any(k.arg == "distributed" and getattr(k.value, "value", False) is True for k in node.keywords)
    return False


def refusals() -> dict[str, dict[str, str | None]]:
    """Every training recipe -> option key -> the reason it refuses the option (``None``: supported; the key is
    left out where the option does not apply)."""
    table = {}
    for name, recipe in builtin_recipes().items():
        tables = (read_recipe_info(recipe.path) or {}).get("optional_keys", [])
        if "finetune" not in tables:
            continue  # generate, eleuther_eval, quantize
        unsupported = read_unsupported(recipe.path)
        if _checks_as_distributed(recipe.path):
            unsupported.setdefault("optimizer_in_bwd", _DISTRIBUTED_REASON)
        row = {}
        for key in OPTIONS.values():
            if key in _DISTRIBUTED_ONLY and "distributed" not in tables:
                continue
            row[key] = unsupported.get(key)
        table[name] = row
    return table


def render() -> str:
    """The Markdown table and, under it, each refusal with its reason (the text between the README's markers)."""
    rows = refusals()
    lines = ["| recipe | " + " | ".join(OPTIONS) + " |", "|---|" + "---|" * len(OPTIONS)]
    for name, row in rows.items():
        cells = ["–" if key not in row else ("no" if row[key] else "yes") for key in OPTIONS.values()]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    reasons: dict[tuple[str, str], list[str]] = {}
    for name, row in rows.items():
        for key, reason in row.items():
            if reason:
                reasons.setdefault((key, reason), []).append(name)
    lines += ["", "Where a recipe says no, `tune run` and `tune validate` refuse the setting and say why:", ""]
    for (key, reason), names in sorted(reasons.items()):
        lines.append(f"- `{key}` in {', '.join(f'`{n}`' for n in names)}: {reason}.")
    return "\n".join(lines)


def readme_table(text: str) -> str | None:
    """The text between the markers of ``text`` (``None`` when the markers are missing)."""
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    current, wanted = readme_table(text), render()
    if "--check" in argv:
        if current == wanted:
            return 0
        print("README.md's recipe table differs from the recipes; run: python tools/recipe_table.py", file=sys.stderr)
        return 1
    if current is None:
        print(f"README.md has no markers {START!r} ... {END!r}; add them where the table goes", file=sys.stderr)
        return 1
    before, rest = text.split(START, 1)
    README.write_text(f"{before}{START}\n{wanted}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
