"""The fixture plugin's recipe: builds components named by plugin name and by module:attr, writes them out."""

import json
import sys
from pathlib import Path

from tune import config


@config.parse
def recipe_main(cfg) -> None:
    by_name = config.instantiate(cfg.greeting)
    by_module_attr = config.instantiate(cfg.farewell)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir, "plugin_result.json").write_text(json.dumps({"greeting": by_name, "farewell": by_module_attr}))


if __name__ == "__main__":
    sys.exit(recipe_main())
