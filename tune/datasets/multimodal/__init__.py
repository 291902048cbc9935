"""Datasets of conversations with images, for vision-language fine-tuning (torchtune's
``torchtune.datasets.multimodal`` builders under the same names)."""

from tune.datasets.multimodal._builders import (
    MultimodalDataset,
    llava_instruct_dataset,
    multimodal_chat_dataset,
    the_cauldron_dataset,
    vqa_dataset,
)

__all__ = [
    "MultimodalDataset",
    "llava_instruct_dataset",
    "multimodal_chat_dataset",
    "the_cauldron_dataset",
    "vqa_dataset",
]
