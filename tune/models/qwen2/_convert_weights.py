"""Qwen2 <-> Hugging Face weights with torchtune's converter arguments.

tune keeps Hugging Face's RoPE layout, so conversion is a renaming of keys: the head counts and widths torchtune's
converters take (to permute query/key rows for its interleaved RoPE) are accepted and not needed. The registry's
converters, which read ``config.json``, are :func:`tune.models.qwen2_5.qwen2_hf_to_tune` and ``qwen2_tune_to_hf``.
"""

from collections.abc import Mapping
from typing import Any

from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf


def qwen2_hf_to_tune(
    state_dict: Mapping[str, Any],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: int | None = None,
    tie_word_embeddings: bool = False,
) -> dict[str, Any]:
    """Hugging Face Qwen2 state dict -> tune keys (torchtune's signature).

    Args:
        state_dict (Mapping[str, Any]): Hugging Face keys -> tensors.
        num_heads, num_kv_heads, dim, head_dim: accepted for torchtune's callers; not needed (see the module).
        tie_word_embeddings (bool): drop ``lm_head.weight`` (the output reuses the token embeddings). Default False.

    Returns:
        dict[str, Any]: tune keys -> the same tensors (``rotary_emb.inv_freq`` buffers are dropped).

    Raises:
        ValueError: for keys with no mapping.
    """
    kept = {key: value for key, value in state_dict.items() if not key.endswith("rotary_emb.inv_freq")}
    return convert_hf_to_tune(kept, {"tie_word_embeddings": tie_word_embeddings})


def qwen2_tune_to_hf(
    state_dict: Mapping[str, Any],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: int | None = None,
    tie_word_embeddings: bool = False,
) -> dict[str, Any]:
    """tune state dict -> Hugging Face Qwen2 keys (torchtune's signature; the inverse of :func:`qwen2_hf_to_tune`).

    Args:
        state_dict (Mapping[str, Any]): tune keys -> tensors.
        num_heads, num_kv_heads, dim, head_dim, tie_word_embeddings: accepted for torchtune's callers; not needed
            (a tied model's state dict has no output weight to write).

    Returns:
        dict[str, Any]: Hugging Face keys -> the same tensors.
    """
    return convert_tune_to_hf(state_dict)
