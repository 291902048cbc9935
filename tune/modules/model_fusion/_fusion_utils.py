"""Marking parameters as "fusion" parameters: the ones that join a pretrained encoder to a pretrained decoder
(projection heads, cross-attention layers, new token embeddings), trained or frozen as a group."""

from torch import nn


def register_fusion_module(module: nn.Module) -> None:
    """Marks every parameter of ``module`` as a fusion parameter (see :func:`get_fusion_params`).

    It gives ``module`` a ``fusion_params()`` method returning the names of all its parameters, relative to it.
    Modules that hold fusion parameters next to others (``FusionLayer``, ``FusionEmbedding``) define the method
    themselves.

    Args:
        module (nn.Module): the module, e.g. a vision-language model's projection head.
    """

    def fusion_params() -> list[str]:
        return [name for name, _ in module.named_parameters()]

    module.fusion_params = fusion_params


def get_fusion_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """The fusion parameters of ``model``: those named by the ``fusion_params()`` method of any of its modules.

    Args:
        model (nn.Module): the model, e.g. a ``DeepFusionModel``.

    Returns:
        dict[str, nn.Parameter]: fully qualified parameter name -> parameter.
    """
    params: dict[str, nn.Parameter] = {}
    for module_name, module in model.named_modules():
        names = getattr(module, "fusion_params", None)
        if not callable(names):
            continue
        for name in names():
            full_name = f"{module_name}.{name}" if module_name else name
            params[full_name] = module.get_parameter(name)
    return params
