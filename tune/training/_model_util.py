"""Small changes to a built model before training."""

import warnings

from torch import nn


def disable_dropout(model: nn.Module) -> None:
    """Sets the probability of every ``nn.Dropout`` in ``model`` to 0, warning for each one that was not.

    Used where dropout would make two forward passes of the same input differ (preference and RL losses compare
    a policy with a reference model).

    Args:
        model (nn.Module): the model, changed in place.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.p != 0:
            warnings.warn(f"Dropout {name or type(model).__name__} had p={module.p}; setting it to 0.", stacklevel=2)
            module.p = 0.0
