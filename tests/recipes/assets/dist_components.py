"""A model converter for the distributed recipe tests that records where in the recipe it ran."""

import json
from pathlib import Path

from torch import nn
from torch.distributed.tensor import DTensor

from tune.utils import get_rank


class RecordingConverter:
    """Writes one JSON line per call to ``path`` (rank 0 only): what ``convert`` and the post-optimizer hook saw.

    ``convert`` must run on the model as built (meta device, not sharded yet); the hook after every optimizer
    step on the sharded model (DTensor parameters).

    Args:
        path (str): the JSON-lines file to append to.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _record(self, event: str, model: nn.Module) -> None:
        if get_rank() == 0:
            params = list(model.parameters())
            record = {
                "event": event,
                "all_meta": all(p.is_meta for p in params),
                "all_sharded": all(isinstance(p, DTensor) for p in params),
            }
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def convert(self, model: nn.Module) -> nn.Module:
        self._record("convert", model)
        return model

    def post_optimizer_hook(self, model: nn.Module) -> None:
        self._record("post_optimizer_hook", model)
