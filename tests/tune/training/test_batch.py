"""tune.training.batch_to_device / model_inputs: nested image batches move whole, shape inputs stay on the host,
and a text model is never passed image arguments."""

import torch

from tune import training


def test_nested_batches_move_and_image_grids_stay_on_the_host():
    batch = {
        "tokens": torch.ones(2, 3, dtype=torch.long),
        "labels": torch.ones(2, 3, dtype=torch.long),
        "encoder_input": {"pixel_values": torch.zeros(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])},
        "encoder_mask": [torch.zeros(3, 5, dtype=torch.bool)],
        "note": "kept",
    }
    moved = training.batch_to_device(batch, torch.device("meta"))
    assert moved["tokens"].is_meta and moved["labels"].is_meta and moved["encoder_mask"][0].is_meta
    assert moved["encoder_input"]["pixel_values"].is_meta
    assert moved["encoder_input"]["image_grid_thw"] is batch["encoder_input"]["image_grid_thw"]  # read on the host
    assert moved["note"] == "kept"


def test_model_inputs_holds_only_what_the_batch_has():
    tokens = torch.ones(1, 2, dtype=torch.long)
    assert training.model_inputs({"tokens": tokens, "labels": tokens}) == {}
    images = {"images": torch.zeros(1, 3, 4, 4)}
    assert training.model_inputs({"tokens": tokens, "encoder_input": images}) == {"encoder_input": images}
