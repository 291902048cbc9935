"""The interface every recipe implements."""

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FTRecipeInterface(Protocol):
    """A fine-tuning recipe: a class whose methods a ``recipe_main(cfg)`` calls in this order.

    ``load_checkpoint`` reads model (and, when resuming, training) state; ``setup`` builds the model, optimizer,
    data and loggers; ``train`` runs the loop; ``save_checkpoint`` writes an atomic checkpoint; ``cleanup``
    releases loggers and process groups. Recipes implement it structurally: no base class is needed.
    """

    def load_checkpoint(self, cfg_checkpointer: Any) -> dict[str, Any]: ...

    def setup(self, cfg: Any) -> None: ...

    def train(self) -> None: ...

    def save_checkpoint(self, epoch: int) -> None: ...

    def cleanup(self) -> None: ...
