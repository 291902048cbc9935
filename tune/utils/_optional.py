import importlib
from types import ModuleType

# optional dependency -> the extra of `pip install tune[...]` that provides it
_EXTRAS = {
    "wandb": "wandb",
    "comet_ml": "comet",
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
    "torch.utils.tensorboard": "tensorboard",
    "lm_eval": "eval",
    "torchao": "torchao",
    "transformers": "dev",
    "peft": "dev",
    "bitsandbytes": "bitsandbytes",
}


def install_hint(module: str) -> str | None:
    """The ``pip install`` command that provides ``module`` when it is one of tune's optional dependencies."""
    top = module.split(".")[0]
    extra = _EXTRAS.get(module, _EXTRAS.get(top))
    return f"pip install 'tune[{extra}]'" if extra else None


def import_optional(module: str, feature: str) -> ModuleType:
    """Imports an optional dependency, or raises an error naming the extra that installs it.

    Args:
        module (str): module to import, e.g. ``"wandb"``.
        feature (str): what needed it, for the message, e.g. ``"WandBLogger"``.

    Returns:
        ModuleType: the imported module.

    Raises:
        ImportError: when the module is not installed; the message says which ``pip install`` fixes it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        extra = _EXTRAS.get(module, _EXTRAS.get(top))
        hint = f"pip install 'tune[{extra}]'" if extra else f"pip install {top}"
        raise ImportError(f"{feature} needs the optional package `{top}`, which is not installed. Run: {hint}") from err
