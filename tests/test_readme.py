"""The README says what the code does: its recipe table is the one the recipes declare, and its links resolve
inside the repository."""

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _recipe_table():
    spec = importlib.util.spec_from_file_location("recipe_table", REPO / "tools" / "recipe_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_recipe_table_is_the_one_the_recipes_declare():
    table = _recipe_table()
    current = table.readme_table((REPO / "README.md").read_text(encoding="utf-8"))
    assert current is not None, "README.md lost the recipe-table markers; see tools/recipe_table.py"
    assert current == table.render(), "README.md's recipe table is stale: run python tools/recipe_table.py"


def test_recipe_table_shows_what_the_rl_and_distributed_recipes_refuse():
    rows = _recipe_table().refusals()
    for name in ("grpo_full_finetune_single_device", "grpo_lora_finetune_single_device"):
        assert rows[name]["compile"] and rows[name]["optimizer_in_bwd"] and rows[name]["dataset_val"]
    assert rows["lora_dpo_single_device"]["dataset.packed"]
    assert rows["ppo_full_finetune_single_device"]["dataset_val"]
    assert "FSDP2" in rows["full_finetune_distributed"]["optimizer_in_bwd"]  # tune.config refuses it distributed
    assert not any(rows["full_finetune_single_device"].values())  # the SFT recipe supports every option
    assert "tensor_parallel_dim" not in rows["full_finetune_single_device"]  # no column for single-device runs
    assert "generate" not in rows and "eleuther_eval" not in rows  # not training recipes


def test_readme_does_not_claim_every_recipe_supports_every_option():
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    claim = re.search(r"Every training recipe supports:(.*?)\.", text).group(1)
    for option in ("optimizer_in_bwd", "compile", "packing", "validation"):
        assert option not in claim, f"the README claims every training recipe supports {option}"


def test_readme_and_docs_link_only_inside_the_repository():
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text, f"{path.name} points outside the repository"
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"
