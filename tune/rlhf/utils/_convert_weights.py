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

# (Hugging Face module path, tune module path); `{}` is a layer index. The parameter name after the path is kept.
_REWARD_MODULES: tuple[tuple[str, str], ...] = (
    ("model.embed_tokens", "tok_embeddings"),
    ("model.norm", "norm"),
    ("score", "output"),
    ("model.layers.{}.self_attn.q_proj", "layers.{}.attn.q_proj"),
    ("model.layers.{}.self_attn.k_proj", "layers.{}.attn.k_proj"),
    ("model.layers.{}.self_attn.v_proj", "layers.{}.attn.v_proj"),
    ("model.layers.{}.self_attn.o_proj", "layers.{}.attn.output_proj"),
    ("model.layers.{}.mlp.gate_proj", "layers.{}.mlp.w1"),
    ("model.layers.{}.mlp.down_proj", "layers.{}.mlp.w2"),
    ("model.layers.{}.mlp.up_proj", "layers.{}.mlp.w3"),
    ("model.layers.{}.input_layernorm", "layers.{}.sa_norm"),
    ("model.layers.{}.post_attention_layernorm", "layers.{}.mlp_norm"),
)
# keys some exports carry that no model parameter matches: RoPE frequencies (recomputed), a score bias (TRL may
# save one; transformers' classifiers have none)
_SKIPPED = re.compile(r"(.*rotary_emb\.inv_freq|score\.bias)$")


def _pattern(path: str) -> re.Pattern:
    return re.compile(re.escape(path).replace(r"\{\}", r"(\d+)") + r"\.(.+)")


def _rename(state_dict: Mapping[str, torch.Tensor], to_tune: bool, source: str) -> dict[str, torch.Tensor]:
    rules = [(_pattern(hf), tune) if to_tune else (_pattern(tune), hf) for hf, tune in _REWARD_MODULES]
    converted, unknown = {}, []
    for key, value in state_dict.items():
        if to_tune and _SKIPPED.match(key):
            continue
        for pattern, target in rules:
            match = pattern.fullmatch(key)
            if match:
                *layer, parameter = match.groups()
                converted[f"{target.format(*layer)}.{parameter}"] = value
                break
        else:
            unknown.append(key)
    if unknown:
        shown = ", ".join(unknown[:8]) + (" ..." if len(unknown) > 8 else "")
        raise ValueError(
            f"{len(unknown)} {source} key(s) are not those of a Llama-style reward model: {shown}. Expected a "
            "transformers *ForSequenceClassification state dict (model.*, score.weight) or tune's classifier keys."
        )
    return converted


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
    return _rename(state_dict, to_tune=True, source="Hugging Face")


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
    return _rename(state_dict, to_tune=False, source="tune")
