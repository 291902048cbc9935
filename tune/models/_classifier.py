"""A sequence classifier (a reward model, say) from the decoder of any text family: its output projection swapped
for a small head that scores every position."""

import torch
from torch import nn

from tune.modules import TransformerDecoder
from tune.modules.peft import AdapterModule
from tune.utils import get_logger

log = get_logger(name=__name__)


def classifier_model(
    base: TransformerDecoder, num_classes: int = 1, *, initializer_range: float = 0.02
) -> TransformerDecoder:
    """Makes a decoder of any family (full or LoRA) a classifier: its output projection becomes a fresh, untied
    ``nn.Linear(embed_dim, num_classes, bias=False)``.

    The model then returns ``[b, s, num_classes]``, a score at every position; a sequence's score is the one at its
    last non-padding token, as transformers' ``*ForSequenceClassification`` models read it. The head is their
    ``score`` layer (``tune.training.FullModelHFCheckpointer`` reads and writes it under that name), initialised as
    transformers initialises it: normal with mean 0 and std ``initializer_range``. A reward model is this with
    ``num_classes=1``. In a config the base model is a nested node::

        model:
          _component_: tune.models.classifier_model
          num_classes: 1
          base:
            _component_: tune.models.qwen2_5.lora_qwen2_5_1_5b_instruct
            lora_attn_modules: [q_proj, v_proj]

    Args:
        base (TransformerDecoder): the decoder, as a family's builder returns it; changed in place. Tied output
            embeddings are untied (the embeddings stay); a LoRA output projection is dropped with a warning.
        num_classes (int): outputs per position. Default 1.
        initializer_range (float): std of the head's initial weights (``initializer_range`` of the model's
            ``config.json``; 0.02 for most families). Default 0.02.

    Returns:
        TransformerDecoder: ``base``, with the new head as its ``output``.

    Raises:
        TypeError: if ``base`` has no ``tok_embeddings`` and ``output`` (not a decoder).
        ValueError: if ``num_classes`` < 1 or ``initializer_range`` < 0.
    """
    if not isinstance(getattr(base, "tok_embeddings", None), nn.Embedding) or not hasattr(base, "output"):
        raise TypeError(
            f"classifier_model needs a decoder with tok_embeddings and output (a family's builder, e.g. "
            f"tune.models.llama3_2.llama3_2_1b), got {type(base).__name__}."
        )
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}.")
    if initializer_range < 0:
        raise ValueError(f"initializer_range must be >= 0, got {initializer_range}.")
    if isinstance(base.output, AdapterModule):
        log.warning("The base model's output projection has LoRA; the classifier replaces it by its own head.")
    embeddings = base.tok_embeddings.weight  # [vocab_size, embed_dim]: the head follows its device and dtype
    head = nn.Linear(embeddings.shape[1], num_classes, bias=False, device=embeddings.device, dtype=embeddings.dtype)
    head.initializer_range = initializer_range  # for init_classifier_head, on a model built on the meta device
    nn.init.normal_(head.weight, mean=0.0, std=initializer_range)
    base.output = head
    return base


def init_classifier_head(model: TransformerDecoder, device: torch.device | str) -> None:
    """Creates and draws the head of a classifier built on the meta device (FSDP2 recipes build the model there and
    load the checkpoint's weights shard by shard; a head the checkpoint lacks is drawn here).

    The head of :func:`classifier_model` is drawn as that function draws it (normal, std ``initializer_range``),
    a family's ``*_classifier`` head by its own ``reset_parameters``. With the same seed on every rank, every
    rank draws the same head. A head already materialised is left as it is.

    Args:
        model (TransformerDecoder): the classifier, its ``output`` the head.
        device (torch.device | str): where the head is created (the device that shards live on).
    """
    head = model.output
    if not head.weight.is_meta:
        return
    head.to_empty(device=device)
    std = getattr(head, "initializer_range", None)
    with torch.no_grad():
        if std is None:
            head.reset_parameters()
        else:
            nn.init.normal_(head.weight, mean=0.0, std=std)
