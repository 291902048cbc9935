"""llama3_2 <-> Hugging Face weights: the Llama layout, shared with every Llama generation (see tune.models.llama2)."""

from tune.models.llama2 import llama_hf_to_tune, llama_tune_to_hf

__all__ = ["llama_hf_to_tune", "llama_tune_to_hf"]
