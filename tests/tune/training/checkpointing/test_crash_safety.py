import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from tests.tune.training.checkpointing.tiny_llama import FAMILY
from tune.training.checkpointing import MODEL_KEY, FullModelHFCheckpointer

REPO = Path(__file__).resolve().parents[4]

# The child saves step_1, then starts saving step_2 and SIGKILLs itself right after the first shard of step_2 is
# on disk (a real kill in the middle of a save; the hook lives in the child only, not in tune).
_CHILD = textwrap.dedent(
    """
    import os, signal, sys, torch
    from tests.tune.training.checkpointing import tiny_llama
    import tune.training.checkpointing._checkpointer as checkpointer_module
    from tune.training.checkpointing import FullModelHFCheckpointer

    tiny_llama.register()
    ckpt = FullModelHFCheckpointer(sys.argv[1], model_type=tiny_llama.FAMILY, output_dir=sys.argv[2])
    state = ckpt.load_checkpoint()
    ckpt.save_checkpoint({**state, "steps_run": 1}, step=1, intermediate_checkpoint=True)
    real_save = checkpointer_module.save_safetensors

    def save_then_die(tensors, path):
        real_save(tensors, path)
        print("killing after", os.path.basename(path), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    checkpointer_module.save_safetensors = save_then_die
    model = {k: v + 1 for k, v in state["model"].items()}
    ckpt.save_checkpoint({"model": model, "steps_run": 2}, step=2, intermediate_checkpoint=True)
    print("not reached", flush=True)
    """
)


def test_sigkill_during_save_leaves_previous_checkpoint_resumable(hf_dir, tmp_path):
    output_dir = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(hf_dir), str(output_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert "killing after model-00001-of-00002.safetensors" in child.stdout and "not reached" not in child.stdout
    # The half-written step_2 stayed in its temporary directory; step_1 is untouched.
    assert (output_dir / ".tmp_step_2" / "model-00001-of-00002.safetensors").is_file()
    assert not (output_dir / "step_2").exists()

    resumed = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=output_dir, resume_from_checkpoint=True)
    assert resumed.resume_dir == output_dir / "step_1"
    assert not (output_dir / ".tmp_step_2").exists()  # cleaned when the next run starts
    loaded = resumed.load_checkpoint()
    assert loaded["steps_run"] == 1 and loaded["recipe_state"]["steps_run"] == 1
    original = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "x").load_checkpoint()
    for key, value in original[MODEL_KEY].items():
        assert torch.equal(loaded[MODEL_KEY][key], value)
