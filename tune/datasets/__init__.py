"""Dataset builders over Hugging Face ``datasets``: instruct, alpaca, chat, text completion, preference, mixing.

Every builder takes the model's tokenizer as its first argument, loads ``source`` with ``datasets.load_dataset``
(hub name, ``"json"``/``"parquet"``/``"csv"``/``"text"`` with ``data_files``, a local directory or file),
tokenises once with ``datasets.map`` (cached on disk) and, with ``packed=True``, returns a
:class:`~tune.data.PackedDataset`. The builders of conversations with images (``multimodal_chat_dataset``,
``llava_instruct_dataset``, ``the_cauldron_dataset``, ``vqa_dataset``) take the family's model transform instead and
return a :class:`MultimodalDataset`, which loads images and tokenises one sample at a time.
"""

from tune.data import PackedDataset
from tune.datasets._alpaca import alpaca_cleaned_dataset, alpaca_dataset
from tune.datasets._chat import chat_dataset
from tune.datasets._cnn_dailymail import cnn_dailymail_articles_dataset
from tune.datasets._concat import ConcatDataset
from tune.datasets._grammar import grammar_dataset
from tune.datasets._hh_rlhf_helpful import hh_rlhf_helpful_dataset
from tune.datasets._instruct import instruct_dataset
from tune.datasets._preference import PreferenceDataset, preference_dataset
from tune.datasets._prompt import PromptDataset, gsm8k_dataset, prompt_dataset
from tune.datasets._samsum import samsum_dataset
from tune.datasets._sft import SFTDataset
from tune.datasets._slimorca import slimorca_dataset
from tune.datasets._stack_exchange_paired import stack_exchange_paired_dataset
from tune.datasets._text_completion import TextCompletionDataset, text_completion_dataset
from tune.datasets._unpaired import (
    UnpairedPreferenceDataset,
    UnpairedToMessages,
    kl_partner_index,
    kl_row,
    unpaired_from_pairs,
    unpaired_preference_dataset,
)
from tune.datasets._weighted import WeightedDataset
from tune.datasets._wikitext import wikitext_dataset
from tune.datasets.multimodal import (
    MultimodalDataset,
    llava_instruct_dataset,
    multimodal_chat_dataset,
    the_cauldron_dataset,
    vqa_dataset,
)

__all__ = [
    "ConcatDataset",
    "MultimodalDataset",
    "PackedDataset",
    "PreferenceDataset",
    "PromptDataset",
    "SFTDataset",
    "TextCompletionDataset",
    "UnpairedPreferenceDataset",
    "UnpairedToMessages",
    "WeightedDataset",
    "alpaca_cleaned_dataset",
    "alpaca_dataset",
    "chat_dataset",
    "cnn_dailymail_articles_dataset",
    "grammar_dataset",
    "gsm8k_dataset",
    "hh_rlhf_helpful_dataset",
    "instruct_dataset",
    "kl_partner_index",
    "kl_row",
    "llava_instruct_dataset",
    "multimodal_chat_dataset",
    "preference_dataset",
    "prompt_dataset",
    "samsum_dataset",
    "slimorca_dataset",
    "stack_exchange_paired_dataset",
    "text_completion_dataset",
    "the_cauldron_dataset",
    "unpaired_from_pairs",
    "unpaired_preference_dataset",
    "vqa_dataset",
    "wikitext_dataset",
]
