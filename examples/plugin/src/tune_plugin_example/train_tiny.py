"""Train a tiny decoder on a dataset from the config, with model converters, and print its final loss and accuracy.

A plugin's recipe is an ordinary tune recipe script: ``tune run tune_example_train --config tune_example/tiny``
(or ``python train_tiny.py --config FILE``), overrides included (``num_steps=10 optimizer.lr=3e-3``).
"""

import sys

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from tune import config, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX

log = utils.get_logger(name="tune_plugin_example.train_tiny")


def _collate(samples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    # the example dataset's sequences all have the same length: stacking is enough
    return {key: torch.tensor([s[key] for s in samples]) for key in ("tokens", "labels")}


class TinyTrainRecipe:
    """Builds the model, applies the model converters, trains ``num_steps`` steps and evaluates.

    Args:
        cfg (DictConfig): the config (see ``configs/tune_example/tiny.yaml``).
    """

    def __init__(self, cfg: DictConfig) -> None:
        training.set_seed(cfg.seed)
        self._num_steps = cfg.num_steps
        self._batch_size = cfg.batch_size

    def setup(self, cfg: DictConfig) -> None:
        """Model (converted), optimizer (with the converters' hooks) and data."""
        self._converters = config.instantiate(cfg.model_converters) or []
        self._model = training.apply_model_converters(config.instantiate(cfg.model), self._converters)
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
        training.register_post_optimizer_hooks(self._optimizer, self._model, self._converters)
        self._dataset = config.instantiate(cfg.dataset)
        self._loader = DataLoader(self._dataset, batch_size=self._batch_size, shuffle=True, collate_fn=_collate)

    def _loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._model(batch["tokens"])[:, :-1]  # predict token t + 1 from tokens up to t
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=CROSS_ENTROPY_IGNORE_IDX
        )
        mask = labels != CROSS_ENTROPY_IGNORE_IDX
        accuracy = ((logits.argmax(-1) == labels) & mask).sum() / mask.sum()
        return loss, accuracy

    def train(self) -> None:
        """Runs the steps, cycling over the data."""
        step = 0
        while step < self._num_steps:
            for batch in self._loader:
                loss, _ = self._loss(batch)
                loss.backward()
                self._optimizer.step()
                self._optimizer.zero_grad(set_to_none=True)
                step += 1
                if step % 10 == 0:
                    log.info("step %d: loss %.4f", step, loss.item())
                if step == self._num_steps:
                    break

    @torch.no_grad()
    def evaluate(self) -> None:
        """Prints the loss and next-token accuracy over the whole dataset."""
        batch = _collate([self._dataset[i] for i in range(len(self._dataset))])
        loss, accuracy = self._loss(batch)
        print(f"tune_example_train: steps={self._num_steps} loss={loss.item():.4f} accuracy={accuracy.item():.3f}")


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Trains and evaluates the tiny model the config describes."""
    recipe = TinyTrainRecipe(cfg)
    recipe.setup(cfg)
    recipe.train()
    recipe.evaluate()


if __name__ == "__main__":
    sys.exit(recipe_main())
