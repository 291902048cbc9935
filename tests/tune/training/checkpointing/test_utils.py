"""torchtune's checkpointing helpers: ModelType with the checkpointers, formatted file lists, the newest epoch
folder, the classifier-head fix-up, and should_load_recipe_state resuming like resume_from_checkpoint."""

import pytest
import torch
from safetensors.torch import save_file

from tune.training.checkpointing import (
    MODEL_KEY,
    FormattedCheckpointFiles,
    FullModelTorchTuneCheckpointer,
    ModelType,
    get_largest_iter_folder,
    update_state_dict_for_classifier,
)


def test_model_type_members_are_the_family_names():
    assert ModelType["LLAMA3_2"] is ModelType.LLAMA3_2 == "llama3_2"
    assert ModelType("qwen2") is ModelType.QWEN2
    assert str(ModelType.PHI3_MINI) == "phi3_mini"


def test_formatted_checkpoint_files():
    files = FormattedCheckpointFiles.from_dict(
        {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00003"}
    )
    assert files.build_checkpoint_filenames() == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]
    with pytest.raises(ValueError, match="exactly two placeholders"):
        FormattedCheckpointFiles("model-{}.safetensors", "2")
    with pytest.raises(ValueError, match="quote it"):
        FormattedCheckpointFiles.from_dict({"filename_format": "m-{}-of-{}", "max_filename": 3})


def test_get_largest_iter_folder_compares_numbers_not_strings(tmp_path):
    assert get_largest_iter_folder(tmp_path) is None
    for name in ("epoch_2", "epoch_10", "epoch_9", "step_50", "notes"):
        (tmp_path / name).mkdir()
    assert get_largest_iter_folder(tmp_path) == "epoch_10"
    assert get_largest_iter_folder(tmp_path, pattern=r"^step_(\d+)") == "step_50"


def test_update_state_dict_for_classifier():
    head = torch.nn.Parameter(torch.zeros(2, 4))
    base = {"output.weight": torch.ones(10, 4), "output.bias": torch.ones(10)}
    with pytest.warns(UserWarning, match="output.bias"):
        update_state_dict_for_classifier(base, [("output.weight", head)])
    assert set(base) == {"output.weight"} and base["output.weight"] is head  # vocab rows != class rows
    same_shape = {"output.weight": torch.ones(2, 4)}
    update_state_dict_for_classifier(same_shape, [("output.weight", head)])
    assert torch.equal(same_shape["output.weight"], torch.ones(2, 4))  # kept unless forced
    update_state_dict_for_classifier(same_shape, [("output.weight", head)], force_override=True)
    assert same_shape["output.weight"] is head
    with pytest.raises(AssertionError, match="output.weight"):
        update_state_dict_for_classifier({}, [("output.weight", head)])


def test_should_load_recipe_state_resumes_like_resume_from_checkpoint(tmp_path):
    source = tmp_path / "model"
    source.mkdir()
    save_file({"w": torch.arange(4.0)}, source / "model.safetensors")
    # torchtune's positional order: ..., recipe_checkpoint, resume_from_checkpoint, should_load_recipe_state
    ckpt = FullModelTorchTuneCheckpointer(str(source), ["model.safetensors"], None, str(tmp_path / "out"))
    state = ckpt.load_checkpoint()
    state[MODEL_KEY] = {"w": state[MODEL_KEY]["w"] + 1}
    ckpt.save_checkpoint({**state, "steps_run": 7}, step=7, intermediate_checkpoint=True)
    resumed = FullModelTorchTuneCheckpointer(
        str(source), ["model.safetensors"], None, str(tmp_path / "out"), None, None, False, True
    ).load_checkpoint()
    assert resumed["steps_run"] == 7 and torch.equal(resumed[MODEL_KEY]["w"], torch.arange(4.0) + 1)
