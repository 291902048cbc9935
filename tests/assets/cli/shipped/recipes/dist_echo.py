"""Fixture recipe that supports distributed runs: each process writes its rank and world size."""

import json
import os
import sys
from pathlib import Path

from tune import config

RECIPE_INFO = {"supports_distributed": True, "configs": ["*/*_dist"]}


@config.parse
def recipe_main(cfg) -> None:
    rank, world_size = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir, f"rank{rank}.json").write_text(json.dumps({"world_size": int(world_size), "tag": cfg.tag}))


if __name__ == "__main__":
    sys.exit(recipe_main())
