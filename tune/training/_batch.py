"""A collated batch on its way into the model: moved to the device, and the model's keyword arguments read from it.

Text batches hold tensors only (``tokens``, ``labels``, and ``mask``/``input_pos`` when packed). A vision-language
batch also holds ``encoder_input``, a dict of tensors (a family's image layout), and for Llama 3.2 Vision the
cross-attention ``encoder_mask``; recipes pass them to the model unchanged, so one loop trains either kind.
"""

from typing import Any

import torch

# The batch keys a model's forward takes as keyword arguments, besides the tokens (its first argument).
MODEL_INPUT_KEYS = ("mask", "input_pos", "encoder_input", "encoder_mask")
# Image inputs that are shapes (Qwen2.5-VL's patch grid of each image): the model reads them on the host to lay out
# its attention, so they stay on the CPU; on the device, reading them back would make every step wait for it.
HOST_INPUT_KEYS = frozenset({"image_grid_thw"})


def batch_to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with every tensor moved to ``device`` (``non_blocking``), in nested dicts and lists too, but for
    the shape inputs of :data:`HOST_INPUT_KEYS`, which stay where they are.

    Args:
        batch (dict[str, Any]): a collated batch.
        device (torch.device): where the model runs.

    Returns:
        dict[str, Any]: the batch on ``device``; values that are not tensors are kept as they are.
    """
    return {key: _to_device(value, device) for key, value in batch.items()}


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: item if key in HOST_INPUT_KEYS else _to_device(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(item, device) for item in value)
    return value


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``model(batch["tokens"], **model_inputs(batch))``: those of
    :data:`MODEL_INPUT_KEYS` the batch holds (a text model is never passed image inputs it does not take).

    Args:
        batch (dict[str, Any]): a collated batch.

    Returns:
        dict[str, Any]: ``mask``, ``input_pos``, ``encoder_input``, ``encoder_mask``, where present.
    """
    return {key: batch[key] for key in MODEL_INPUT_KEYS if key in batch}
