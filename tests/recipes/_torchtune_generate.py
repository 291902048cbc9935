"""torchtune 0.6.1's ``recipes/generate.py`` moved with ``tune migrate``, run beside tune's own ``generate`` recipe.

Both run torchtune's ``generation.yaml`` (migrated too) with the same overrides: a family's tiny checkpoint and
tokenizer (tests/recipes/_family_assets.py), fp32 on CPU, greedy decoding. torchtune's recipe logs the decoded
prompt and continuation; tune's prints the continuation alone, so the first must be the prompt followed by the
second.

By hand, from the repository root (the wheel is the one test_torchtune_published_configs.py downloads):

    .venv/bin/python -m tests.recipes._torchtune_generate ~/.cache/tune-tests/torchtune-0.6.1/*.whl /tmp/gen
"""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.recipes import _family_assets as assets

FAMILY = "llama2"  # generation.yaml's model
PROMPT = "Add the two numbers. 12 and 30"
MAX_NEW_TOKENS = 16


def _tune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tune._cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def migrate_generate(wheel: Path, root: Path) -> tuple[Path, Path]:
    """torchtune's generate recipe and generation config from the wheel, through ``tune migrate``: their paths."""
    source = root / "torchtune"
    source.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        (source / "generate.py").write_bytes(archive.read("recipes/generate.py"))
        (source / "generation.yaml").write_bytes(archive.read("recipes/configs/generation.yaml"))
    proc = _tune("migrate", str(source), "--output", str(root / "migrated"), cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "migrated" / "generate.py", root / "migrated" / "generation.yaml"


def generation_overrides(data: Path, out: Path) -> list[str]:
    """The overrides both recipes run with: tiny model, checkpoint (``data/hf``) and tokenizer; greedy; CPU fp32."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *assets.model_overrides(FAMILY, "full"),
        f"tokenizer.path={assets.tokenizer_file(assets.FAMILIES[FAMILY].tokenizer)}",
        f"tokenizer.max_seq_len={assets.MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={data / 'hf'}",
        "checkpointer.checkpoint_files=[model.safetensors]",
        f"checkpointer.output_dir={out}",
        f"prompt.user={PROMPT}",
        f"max_new_tokens={MAX_NEW_TOKENS}",
        "temperature=0",
        "top_k=1",
        "seed=0",
    ]


def run_both(wheel: Path, root: Path, data: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Runs the migrated torchtune recipe and tune's ``generate`` on the migrated config: (torchtune's, tune's)."""
    recipe, config = migrate_generate(wheel, root)
    overrides = generation_overrides(data, root / "out")
    migrated = _tune("run", str(recipe), "--config", str(config), *overrides, cwd=root)
    ours = _tune("run", "generate", "--config", str(config), *overrides, cwd=root)
    return migrated, ours


def generated_texts(migrated: subprocess.CompletedProcess, ours: subprocess.CompletedProcess) -> tuple[str, str]:
    """(the prompt and continuation torchtune's recipe logs, the continuation tune's recipe prints)."""
    logged = re.search(
        r"precision torch\.\w+\.\nINFO:tune: (.*?)\nINFO:tune: Time for inference", migrated.stderr, flags=re.DOTALL
    )
    assert logged is not None, migrated.stderr[-4000:]
    return logged.group(1), ours.stdout.removesuffix("\n")


def main() -> None:
    wheel, root = Path(sys.argv[1]), Path(sys.argv[2])
    data = root / "assets"
    if not (data / "hf" / "model.safetensors").is_file():
        assets.build_family_assets(FAMILY, data)
    migrated, ours = run_both(wheel, root, data)
    for name, proc in (("migrated torchtune generate.py", migrated), ("tune generate", ours)):
        if proc.returncode != 0:
            print(f"--- {name}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
            sys.exit(1)
    logged, printed = generated_texts(migrated, ours)
    print(f"torchtune's generate.py, migrated, logs: {logged!r}")
    print(f"tune's generate recipe prints:          {printed!r}")
    print(f"the same continuation of {PROMPT!r}: {logged == PROMPT + printed}")
    sys.exit(0 if logged == PROMPT + printed else 1)


if __name__ == "__main__":
    main()
