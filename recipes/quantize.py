"""Turn a checkpoint trained with quantisation-aware training (QAT) into the real quantised model, and save it.

Train with the QAT converter in the fine-tuning config (the checkpoint it saves has ordinary weights, LoRA
already merged)::

    model_converters:
      - _component_: tune.training.Int8DynActInt4WeightQATConverter
        groupsize: 32

then point this recipe's checkpointer at a checkpoint that run wrote (``output_dir/step_N``), with the same
``quantizer`` settings::

    tune run quantize --config quantization checkpointer.checkpoint_dir=/tmp/tune/llama3_2_1B/qat/step_1000

The quantised state dict (torchao tensor subclasses) is written with ``torch.save`` to
``output_dir/model_<quantizer>.pt``; ``torch.load(path, weights_only=True)`` reads it back into a model built and
quantised the same way (``quantizer.quantize(model)`` then ``model.load_state_dict(sd, assign=True)``). With
``eval_tokens`` set, the recipe also checks that the quantised model computes what the fake-quantised one did.
"""

import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from tune import config, training, utils

RECIPE_INFO = {"supports_distributed": False, "configs": ["quantization"]}

log = utils.get_logger(name="tune.recipes.quantize")


class QuantizationRecipe:
    """Loads a trained checkpoint into the model, quantises it with ``quantizer.quantize`` and saves it.

    Args:
        cfg (DictConfig): the config (see ``configs/quantization.yaml``).

    Raises:
        ValueError: when the quantizer has no ``quantize(model)`` method.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        self._output_dir = Path(cfg.output_dir)
        training.set_seed(cfg.seed)
        self._quantizer = config.instantiate(cfg.quantizer)
        if not callable(getattr(self._quantizer, "quantize", None)):
            raise ValueError(
                f"quantizer._component_={cfg.quantizer._component_} has no quantize(model) method; use "
                "tune.training.Int8DynActInt4WeightQATConverter (the converter the QAT run used)."
            )
        self._model: torch.nn.Module | None = None
        self._fake_logits: torch.Tensor | None = None
        self._eval_tokens = cfg.eval_tokens

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Reads the trained weights.

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the checkpoint, the model state under ``training.MODEL_KEY``.
        """
        return config.instantiate(cfg_checkpointer).load_checkpoint()

    def setup(self, cfg: DictConfig) -> None:
        """Builds the model and loads the trained weights into it."""
        ckpt = self.load_checkpoint(cfg.checkpointer)
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg.model)
        model.load_state_dict(ckpt[training.MODEL_KEY])
        model.eval()
        self._model = model
        log.info("Loaded %s with %d parameters", cfg.model._component_, sum(p.numel() for p in model.parameters()))

    def _probe_tokens(self) -> torch.Tensor | None:
        if self._eval_tokens is None:
            return None
        return torch.as_tensor(list(self._eval_tokens), dtype=torch.long, device=self._device)[None]

    @torch.no_grad()
    def quantize(self) -> None:
        """Quantises the model; with ``eval_tokens``, first records the fake-quantised model's logits."""
        assert self._model is not None
        tokens = self._probe_tokens()
        if tokens is not None:  # what training saw: the same weights with fake quantisation
            self._fake_logits = self._quantizer.convert(self._model)(tokens).float()
        start = time.perf_counter()
        self._model = self._quantizer.quantize(self._model)
        log.info("Quantised in %.1f s", time.perf_counter() - start)
        if tokens is not None:
            logits = self._model(tokens).float()
            diff = (logits - self._fake_logits).abs().max().item()
            agree = (logits.argmax(-1) == self._fake_logits.argmax(-1)).float().mean().item()
            log.info("Quantised vs fake-quantised logits: max |diff| %.3g, argmax agreement %.1f%%", diff, 100 * agree)

    def save_checkpoint(self) -> Path:
        """Saves the quantised state dict to ``output_dir/model_<quantizer>.pt``.

        Returns:
            Path: the file written.
        """
        assert self._model is not None
        self._output_dir.mkdir(parents=True, exist_ok=True)
        name = type(self._quantizer).__name__.removesuffix("QATConverter").removesuffix("Converter").lower()
        path = self._output_dir / f"model_{name or 'quantized'}.pt"
        tmp = path.with_suffix(".pt.tmp")
        try:
            torch.save(self._model.state_dict(), tmp)
            tmp.replace(path)  # atomic: a crash never leaves a half-written file under the final name
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write (a full disk) as a RuntimeError
            tmp.unlink(missing_ok=True)
            raise utils.TuneError(
                f"Could not write the quantised model {path}: {err}. A {path.name} written before is as it was; free "
                "disk space or raise the file-size limit (`ulimit -f`), or set output_dir to another disk, then run "
                "again."
            ) from err
        log.info("Saved the quantised model to %s (%.2f MiB)", path, path.stat().st_size / 2**20)
        return path


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Loads, quantises and saves the model the config describes."""
    config.log_config(recipe_name="QuantizationRecipe", cfg=cfg)
    recipe = QuantizationRecipe(cfg)
    recipe.setup(cfg)
    recipe.quantize()
    recipe.save_checkpoint()


if __name__ == "__main__":
    sys.exit(recipe_main())
