"""Model families (one folder each) and loading Hugging Face checkpoints without naming a builder.

Importing this package registers every built-in family in ``tune.registry``.
"""

from tune.models import gemma2, llama2, llama3, llama3_1, llama3_2, llama3_3, mistral, phi3, qwen2_5, qwen3
from tune.models._hf import from_hf, to_hf_state_dict

__all__ = [
    "from_hf",
    "gemma2",
    "llama2",
    "llama3",
    "llama3_1",
    "llama3_2",
    "llama3_3",
    "mistral",
    "phi3",
    "qwen2_5",
    "qwen3",
    "to_hf_state_dict",
]
