"""Reward models in Hugging Face's ``*ForSequenceClassification`` layout <-> tune's classifier models.

A Llama-style sequence classifier in transformers (``LlamaForSequenceClassification``,
``MistralForSequenceClassification``) is the decoder under ``model.`` plus a bias-free ``score`` projection to
``num_labels`` outputs. tune's classifier builders (``tune.models.llama2.llama2_classifier``,
``tune.models.mistral.mistral_classifier``) hold the same projection as their ``output`` layer. tune keeps Hugging
Face's rotary layout and norm parameter names, so only the module paths change.
"""

import re
from collections.abc import Mapping

import torch

from tune.utils._state_dict_keys import invert_rules, rename_keys

# (Hugging Face module-path prefix, tune's); the parameter name after the path is kept
_REWARD_RULES: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.", "tok_embeddings."),
    (r"model\.norm\.", "norm."),
    (r"score\.", "output."),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.", r"layers.\1.attn.q_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.", r"layers.\1.attn.k_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.", r"layers.\1.attn.v_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.attn.output_proj."),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.mlp.w1."),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.mlp.w2."),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.mlp.w3."),
    (r"model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.sa_norm."),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.mlp_norm."),
)
# a score bias some exports carry (TRL may save one; transformers' classifiers have none): dropped
_SKIPPED = re.compile(r"score\.bias$")
_HINT = (
    "They are not those of a Llama-style reward model: expected a transformers *ForSequenceClassification state dict "
    "(model.*, score.weight) or tune's classifier keys."
)


def reward_hf_to_tune(
    state_dict: Mapping[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: int | None = None,
) -> dict[str, torch.Tensor]:
    """A Hugging Face Llama-style sequence-classification state dict -> tune's classifier keys.

    ``score.weight`` becomes ``output.weight`` (the classifier head of ``llama2_classifier``/
    ``mistral_classifier``); ``score.bias`` and saved RoPE frequencies are dropped. Consolidate sharded files
    into one state dict first.

    Args:
        state_dict (Mapping[str, torch.Tensor]): Hugging Face keys -> tensors.
        num_heads (int): accepted for torchtune's signature; unused (tune keeps Hugging Face's rotary layout, so
            the q/k rows are not permuted). Default 32.
        num_kv_heads (int): as ``num_heads``. Default 32.
        dim (int): as ``num_heads``. Default 4096.
        head_dim (int | None): as ``num_heads``. Default None.

    Returns:
        dict[str, torch.Tensor]: tune keys -> the same tensors.

    Raises:
        ValueError: listing the keys that are not a Llama-style reward model's.
    """
    return rename_keys(state_dict, _REWARD_RULES, source="Hugging Face", skip=_SKIPPED, hint=_HINT)


def reward_tune_to_hf(
    state_dict: Mapping[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
) -> dict[str, torch.Tensor]:
    """tune's classifier keys -> a Hugging Face ``*ForSequenceClassification`` state dict (the inverse of
    :func:`reward_hf_to_tune`: ``output.weight`` becomes ``score.weight``).

    Args:
        state_dict (Mapping[str, torch.Tensor]): tune keys -> tensors.
        num_heads (int): accepted for torchtune's signature; unused. Default 32.
        num_kv_heads (int): as ``num_heads``. Default 32.
        dim (int): as ``num_heads``. Default 4096.

    Returns:
        dict[str, torch.Tensor]: Hugging Face keys -> the same tensors.

    Raises:
        ValueError: listing the keys that are not a tune classifier's.
    """
    return rename_keys(state_dict, invert_rules(_REWARD_RULES), source="tune", hint=_HINT)
