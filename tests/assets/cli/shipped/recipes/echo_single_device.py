"""Fixture recipe for the CLI tests: builds the config's components and writes what it built as JSON.

It imports no torch-heavy tune module, so `tune run` of it takes a fraction of a second.
"""

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tune import config

RECIPE_INFO = {"supports_distributed": False, "configs": ["*/*_echo", "echo_*"]}


class Scaler:
    """A component defined in the recipe file itself: configs name it `_component_: Scaler`."""

    def __init__(self, values: list[float], factor: float, offset: float = 0.0):
        self.values = [v * factor + offset for v in values]


def _setup_scaler(cfg_scaler):
    return config.instantiate(cfg_scaler, [1.0, 2.0])


@config.parse
def recipe_main(cfg) -> None:
    scaler = _setup_scaler(cfg_scaler=cfg.scaler)
    things = config.instantiate(cfg.things)
    result = {
        "argv0": sys.argv[0],
        "message": cfg.message,
        "scaled": scaler.values,
        "things": [repr(thing) for thing in things],
        "extra": OmegaConf.to_container(cfg.extra) if cfg.get("extra") is not None else None,
    }
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(recipe_main())
