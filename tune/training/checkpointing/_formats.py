"""Key maps between tune's state dicts and other formats: Meta's ``consolidated.00.pth`` and PEFT adapters.

tune's attention uses Hugging Face's "rotate_half" RoPE layout, so tune <-> HF is a pure key rename done by each
family's converter (found through the registry). Meta checkpoints rotate interleaved pairs instead, so their q/k
projection rows are permuted; the Meta <-> HF map below is the same for every Llama-style family, and Meta <-> tune
goes through HF.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tune.modules.peft import dequantize, is_expert_adapter_key, merge_lora_experts_state_dict
from tune.registry import AdapterConverter
from tune.training.checkpointing._io import load_weights_file, save_safetensors
from tune.utils import get_logger

log = get_logger(name="tune.training.checkpointing")

# (Meta key, HF key): the Llama reference layout vs transformers' LlamaForCausalLM; "{}" is the layer index.
_META_HF_KEYS = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("layers.{}.attention.wq.weight", "model.layers.{}.self_attn.q_proj.weight"),
    ("layers.{}.attention.wk.weight", "model.layers.{}.self_attn.k_proj.weight"),
    ("layers.{}.attention.wv.weight", "model.layers.{}.self_attn.v_proj.weight"),
    ("layers.{}.attention.wo.weight", "model.layers.{}.self_attn.o_proj.weight"),
    ("layers.{}.feed_forward.w1.weight", "model.layers.{}.mlp.gate_proj.weight"),
    ("layers.{}.feed_forward.w2.weight", "model.layers.{}.mlp.down_proj.weight"),
    ("layers.{}.feed_forward.w3.weight", "model.layers.{}.mlp.up_proj.weight"),
    ("layers.{}.attention_norm.weight", "model.layers.{}.input_layernorm.weight"),
    ("layers.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"),
]


def _key_pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


_META_TO_HF = [(_key_pattern(meta), hf) for meta, hf in _META_HF_KEYS]
_HF_TO_META = [(_key_pattern(hf), meta) for meta, hf in _META_HF_KEYS]
# Meta-only buffers with no HF counterpart (precomputed RoPE frequencies).
_META_IGNORED = re.compile(r"^(rope\.freqs|layers\.\d+\.attention\.inner_attention\.rope\.freqs)$")


def permute_meta_to_hf(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorders q/k projection rows from Meta's interleaved RoPE pairs to the rotate_half layout.

    Within each head, Meta rotates the pairs ``(0, 1), (2, 3), ...`` of the head dimension; rotate_half rotates
    ``(i, i + head_dim / 2)``. Row ``2i + j`` of a Meta head becomes row ``j * head_dim / 2 + i``.

    Args:
        weight (torch.Tensor): ``[num_heads * head_dim, in_dim]``.
        num_heads (int): heads of this projection (``num_kv_heads`` for k).

    Returns:
        torch.Tensor: the permuted weight, same shape.
    """
    out_dim, in_dim = weight.shape
    head_dim = out_dim // num_heads
    # [n_h, h_d/2, 2, in] -> [n_h, 2, h_d/2, in]
    return weight.view(num_heads, head_dim // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def permute_hf_to_meta(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The inverse of :func:`permute_meta_to_hf`.

    Args:
        weight (torch.Tensor): ``[num_heads * head_dim, in_dim]`` in the rotate_half layout.
        num_heads (int): heads of this projection.

    Returns:
        torch.Tensor: the weight in Meta's interleaved layout.
    """
    out_dim, in_dim = weight.shape
    head_dim = out_dim // num_heads
    return weight.view(num_heads, 2, head_dim // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def meta_to_hf(state_dict: Mapping[str, torch.Tensor], num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """Converts a Llama-style Meta state dict to Hugging Face (LlamaForCausalLM) keys and RoPE layout.

    Args:
        state_dict (Mapping[str, torch.Tensor]): Meta keys (``layers.0.attention.wq.weight``, ...).
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.

    Returns:
        dict[str, torch.Tensor]: HF keys.

    Raises:
        ValueError: naming a key that is not part of the Llama layout.
    """
    converted = {}
    for key, value in state_dict.items():
        if _META_IGNORED.match(key):
            continue
        new_key = _map_key(key, _META_TO_HF, "Meta")
        if new_key.endswith("q_proj.weight"):
            value = permute_meta_to_hf(value, num_heads)
        elif new_key.endswith("k_proj.weight"):
            value = permute_meta_to_hf(value, num_kv_heads)
        converted[new_key] = value
    return converted


def hf_to_meta(state_dict: Mapping[str, torch.Tensor], num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """Converts a Llama-style Hugging Face state dict to Meta's keys and interleaved RoPE layout.

    Args:
        state_dict (Mapping[str, torch.Tensor]): HF keys.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads.

    Returns:
        dict[str, torch.Tensor]: Meta keys.

    Raises:
        ValueError: naming a key that has no Meta counterpart.
    """
    converted = {}
    for key, value in state_dict.items():
        if key.endswith("q_proj.weight"):
            value = permute_hf_to_meta(value, num_heads)
        elif key.endswith("k_proj.weight"):
            value = permute_hf_to_meta(value, num_kv_heads)
        converted[_map_key(key, _HF_TO_META, "Hugging Face")] = value
    return converted


# ---------------------------------------------------------------------------------------------------------------
# torchtune's own layout (FullModelTorchTuneCheckpointer)
# ---------------------------------------------------------------------------------------------------------------

# q/k projection entries whose rows follow the RoPE layout: weights, biases, LoRA B and DoRA magnitudes
_ROPE_ROWS = re.compile(r"\.(q|k)_proj\.(weight|bias|lora_b\.weight|magnitude)$")
_TORCHTUNE_NORM_SUFFIX = ".scale"


def is_torchtune_layout(state_dict: Mapping[str, Any]) -> bool:
    """Whether a state dict of a family torchtune has was written by torchtune: its norms' parameter is ``scale``.

    tune (like Hugging Face) names the parameter of RMSNorm and Gemma's norms ``weight``; torchtune names it
    ``scale``. No model of the families tune shares with torchtune has a parameter called ``scale``, so one such key
    decides (a user's own family may: the checkpointer asks only for families with a ``TorchtuneLayout``).
    """
    return any(key.endswith(_TORCHTUNE_NORM_SUFFIX) for key in state_dict)


def _permute_rows(value: torch.Tensor, num_heads: int, to_rotate_half: bool) -> torch.Tensor:
    flat = value.reshape(value.shape[0], -1)  # [out, in] weights, [out, r] LoRA B, [out] biases and magnitudes
    permute = permute_meta_to_hf if to_rotate_half else permute_hf_to_meta
    return permute(flat, num_heads).reshape(value.shape)


def torchtune_to_tune(
    state_dict: Mapping[str, Any],
    heads: tuple[int, int] | None = None,
    renames: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Converts weights in torchtune's layout (as its ``FullModelTorchTuneCheckpointer`` writes them) to tune's.

    Module names are the same; two things differ. torchtune names the norms' parameter ``scale`` (tune:
    ``weight``), and for the families whose torchtune RoPE rotates interleaved pairs (Llama, Mistral, Gemma:
    ``TorchtuneLayout.interleaved_rope``) the rows of the q/k projections are in Meta's order, where tune
    uses Hugging Face's rotate_half order. LoRA B matrices and DoRA magnitudes of q/k follow their rows.

    Args:
        state_dict (Mapping[str, Any]): torchtune's keys (model weights, adapter weights, or both).
        heads (tuple[int, int] | None): ``(num_heads, num_kv_heads)`` to permute the q/k rows; None for a family
            whose torchtune RoPE is already rotate_half (Qwen, Phi-3).
        renames (Sequence[tuple[str, str]]): the family's ``TorchtuneLayout.key_renames``: ``(regex, replacement)``
            applied (first match) after ``scale`` -> ``weight``.

    Returns:
        dict[str, Any]: tune's keys and layout.
    """
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in renames]
    converted = {}
    for key, value in state_dict.items():
        if key.endswith(_TORCHTUNE_NORM_SUFFIX):
            key = key[: -len(_TORCHTUNE_NORM_SUFFIX)] + ".weight"
        for pattern, replacement in compiled:
            if pattern.search(key):
                key = pattern.sub(replacement, key)
                break
        if heads is not None and (match := _ROPE_ROWS.search(key)) is not None:
            value = _permute_rows(value, heads[0] if match[1] == "q" else heads[1], to_rotate_half=True)
        converted[key] = value
    return converted


def tune_to_torchtune(
    state_dict: Mapping[str, Any], heads: tuple[int, int] | None, names: Mapping[str, str]
) -> dict[str, Any]:
    """The inverse of :func:`torchtune_to_tune`: tune's weights back in torchtune's layout.

    Args:
        state_dict (Mapping[str, Any]): tune's keys.
        heads (tuple[int, int] | None): as for :func:`torchtune_to_tune`.
        names (Mapping[str, str]): tune key -> torchtune key for every key :func:`torchtune_to_tune` renamed
            (what was read gives the names to write); other keys keep their name.

    Returns:
        dict[str, Any]: torchtune's keys and layout.
    """
    converted = {}
    for key, value in state_dict.items():
        if heads is not None and (match := _ROPE_ROWS.search(key)) is not None:
            value = _permute_rows(value, heads[0] if match[1] == "q" else heads[1], to_rotate_half=False)
        converted[names.get(key, key)] = value
    return converted


def _map_key(key: str, table: list[tuple[re.Pattern, str]], source: str) -> str:
    for pattern, template in table:
        match = pattern.match(key)
        if match:
            return template.format(*match.groups())
    raise ValueError(
        f"{source} key {key!r} has no counterpart in the Meta Llama layout (tok_embeddings, layers.N.attention.wq/"
        "wk/wv/wo, layers.N.feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm, output). This checkpointer "
        "handles Llama-style models only; use FullModelHFCheckpointer for other families."
    )


# ---------------------------------------------------------------------------------------------------------------
# LoRA / DoRA adapters
# ---------------------------------------------------------------------------------------------------------------

# tune adapter parameter suffix -> PEFT suffix. DoRA's magnitude is saved by PEFT without a ".weight".
_TUNE_TO_PEFT_SUFFIX = {
    "lora_a.weight": "lora_A.weight",
    "lora_b.weight": "lora_B.weight",
    "magnitude": "lora_magnitude_vector",
}
_PEFT_TO_TUNE_SUFFIX = {peft: tune for tune, peft in _TUNE_TO_PEFT_SUFFIX.items()}
_PEFT_TO_TUNE_SUFFIX["lora_magnitude_vector.weight"] = "magnitude"
PEFT_PREFIX = "base_model.model."

StateDictConverter = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]


# The LoRA of stacked experts (tune.modules.peft.LoRASwiGLUExperts: `...experts.gate_proj_lora_a`, [E, r, in]) has
# no module in PEFT to be loaded into: these adapters are left out of adapter_model.safetensors and written, in
# tune's keys, to this file next to it (read back on resume); the merged model holds them merged.
EXPERT_ADAPTER_FILE = "expert_adapter.safetensors"


def is_adapter_key(key: str) -> bool:
    """Whether ``key`` names a LoRA/DoRA adapter parameter in tune's layout (``lora_a``, ``lora_b``, ``magnitude``,
    or an expert adapter ``<proj>_lora_a`` / ``<proj>_lora_b``)."""
    return is_expert_adapter_key(key) or any(
        key.endswith("." + suffix) or key == suffix for suffix in _TUNE_TO_PEFT_SUFFIX
    )


def split_expert_adapter(
    adapter: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Splits adapter weights into (2-D LoRA/DoRA adapters, expert adapters of stacked experts)."""
    plain, experts = {}, {}
    for key, value in adapter.items():
        (experts if is_expert_adapter_key(key) else plain)[key] = value
    return plain, experts


def save_expert_adapter(adapter: Mapping[str, torch.Tensor], directory: Path) -> None:
    """Writes the expert adapters of ``adapter`` (if any) in tune's keys to ``directory/expert_adapter.safetensors``.

    Args:
        adapter (Mapping[str, torch.Tensor]): tune adapter weights (the 2-D ones are ignored here).
        directory (Path): the adapter directory (next to ``adapter_model.safetensors``).
    """
    _, experts = split_expert_adapter(adapter)
    if experts:
        save_safetensors({k: v.detach().contiguous() for k, v in experts.items()}, directory / EXPERT_ADAPTER_FILE)


def load_expert_adapter(directory: Path) -> dict[str, torch.Tensor]:
    """The expert adapters :func:`save_expert_adapter` wrote to ``directory`` (empty when there is no such file)."""
    file = Path(directory) / EXPERT_ADAPTER_FILE
    return load_weights_file(file) if file.is_file() else {}


def split_adapter(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Splits a LoRA model's state dict into (base weights, adapter weights).

    Args:
        state_dict (Mapping[str, torch.Tensor]): e.g. ``lora_model.state_dict()``.

    Returns:
        tuple[dict, dict]: the base keys and the adapter keys.
    """
    base, adapter = {}, {}
    for key, value in state_dict.items():
        (adapter if is_adapter_key(key) else base)[key] = value
    return base, adapter


def _group_by_module(adapter: Mapping[str, torch.Tensor], suffixes: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    # {"layers.0.attn.q_proj": {"lora_a.weight": tensor, ...}}
    modules: dict[str, dict[str, Any]] = {}
    for key, value in adapter.items():
        for suffix in suffixes:
            if key.endswith("." + suffix):
                modules.setdefault(key[: -len(suffix) - 1], {})[suffix] = value
                break
        else:
            raise ValueError(f"{key!r} is not a LoRA/DoRA parameter (expected a key ending in {sorted(suffixes)}).")
    return modules


def _map_module(prefix: str, shape: tuple[int, int], converter: StateDictConverter, config: Mapping[str, Any]) -> str:
    # Convert the module's (imagined) base weight alone, on the meta device, to learn the module's name over there.
    probe = {f"{prefix}.weight": torch.empty(shape, device="meta")}
    converted = converter(probe, config)
    if len(converted) != 1 or not next(iter(converted)).endswith(".weight"):
        raise ValueError(
            f"Cannot map the adapter of module {prefix!r}: the family's converter maps its weight to "
            f"{sorted(converted)} rather than to one '<module>.weight' key. A family whose HF model fuses projections "
            "needs an adapter_converter in its ModelFamily (see tune.registry.AdapterConverter)."
        )
    return next(iter(converted))[: -len(".weight")]


def _base_shape(parts: Mapping[str, torch.Tensor], prefix: str, a: str, b: str) -> tuple[int, int]:
    if a not in parts or b not in parts:
        raise ValueError(f"Adapter of module {prefix!r} lacks {a!r} or {b!r}; found {sorted(parts)}.")
    return (parts[b].shape[0], parts[a].shape[1])


def adapter_to_peft(
    adapter: Mapping[str, torch.Tensor],
    converter: StateDictConverter,
    hf_config: Mapping[str, Any],
    *,
    lora_alpha: float | None = None,
    adapter_converter: AdapterConverter | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """Converts tune adapter weights to PEFT's keys (``base_model.model.<HF module>.lora_A.weight``, ...).

    Args:
        adapter (Mapping[str, torch.Tensor]): tune keys ending in ``lora_a.weight``, ``lora_b.weight``, ``magnitude``.
        converter (StateDictConverter): the family's ``tune_to_hf``.
        hf_config (Mapping[str, Any]): the HF ``config.json`` as a dict.
        lora_alpha (float | None): the adapters' alpha; needed with ``adapter_converter``.
        adapter_converter (AdapterConverter | None): the family's converter for modules HF fuses (Phi-3's
            ``qkv_proj``); the other modules are mapped one by one through ``converter``.

    Returns:
        tuple[dict, dict, dict]: the PEFT state dict, the rank of each adapted module by HF module name, and the
        alpha of each module whose alpha is not ``lora_alpha`` (PEFT's ``alpha_pattern``). Expert adapters
        (:func:`is_expert_adapter_key`) are left out, with a logged note: see :func:`save_expert_adapter`.

    Raises:
        ValueError: when a module cannot be mapped to one HF module.
    """
    peft_state, ranks, alphas = {}, {}, {}
    adapter, experts = split_expert_adapter(adapter)
    if experts:
        log.info(
            "%d expert adapter tensors (LoRA on stacked experts) are not in the PEFT adapter: PEFT has no module to "
            "load them into. They are written in tune's keys to %s next to it, and merged into the full model.",
            len(experts),
            EXPERT_ADAPTER_FILE,
        )
    if adapter_converter is not None:
        if lora_alpha is None:
            raise ValueError("adapter_to_peft needs lora_alpha to fuse adapters with the family's adapter_converter.")
        adapter, fused, ranks, alphas = adapter_converter.to_peft(adapter, hf_config, lora_alpha)
        peft_state = {PEFT_PREFIX + key: value for key, value in fused.items()}
    for prefix, parts in _group_by_module(adapter, _TUNE_TO_PEFT_SUFFIX).items():
        shape = _base_shape(parts, prefix, "lora_a.weight", "lora_b.weight")
        hf_module = _map_module(prefix, shape, converter, hf_config)
        ranks[hf_module] = parts["lora_a.weight"].shape[0]
        for suffix, value in parts.items():
            peft_state[f"{PEFT_PREFIX}{hf_module}.{_TUNE_TO_PEFT_SUFFIX[suffix]}"] = value
    return peft_state, ranks, alphas


def _peft_pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    # PEFT's rank_pattern / alpha_pattern: a key applies when it matches a dotted tail of the module name (regex).
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def peft_scaling(module: str, peft_config: Mapping[str, Any]) -> float:
    """The scaling ``alpha / r`` PEFT gives ``module`` under ``peft_config`` (with its rank and alpha patterns).

    Args:
        module (str): an HF module name (``model.layers.0.self_attn.q_proj``).
        peft_config (Mapping[str, Any]): ``adapter_config.json`` as a dict.

    Returns:
        float: the scaling.
    """
    rank = _peft_pattern_value(peft_config.get("rank_pattern") or {}, module, peft_config["r"])
    alpha = _peft_pattern_value(peft_config.get("alpha_pattern") or {}, module, peft_config["lora_alpha"])
    return float(alpha) / float(rank)


def peft_to_adapter(
    peft_state: Mapping[str, torch.Tensor],
    converter: StateDictConverter,
    hf_config: Mapping[str, Any],
    *,
    peft_config: Mapping[str, Any] | None = None,
    adapter_converter: AdapterConverter | None = None,
) -> dict[str, torch.Tensor]:
    """Converts a PEFT adapter state dict back to tune's adapter keys.

    With ``peft_config``, each ``lora_B`` is rescaled so that tune's scaling (``lora_alpha / r`` of the module)
    gives PEFT's (which ``rank_pattern``/``alpha_pattern`` may change); the adapters tune writes need no rescaling.

    Args:
        peft_state (Mapping[str, torch.Tensor]): keys as in ``adapter_model.safetensors``.
        converter (StateDictConverter): the family's ``hf_to_tune``.
        hf_config (Mapping[str, Any]): the HF ``config.json`` as a dict.
        peft_config (Mapping[str, Any] | None): ``adapter_config.json`` as a dict, when there is one.
        adapter_converter (AdapterConverter | None): the family's converter for modules HF fuses.

    Returns:
        dict[str, torch.Tensor]: tune adapter keys (``layers.0.attn.q_proj.lora_a.weight``, ...).

    Raises:
        ValueError: for keys that are not LoRA/DoRA parameters (e.g. ``modules_to_save`` or LoRA biases), or a fused
            module the family cannot split exactly.
    """
    # expert adapters read from their own file (load_expert_adapter) are in tune's keys already: passed through
    peft_state, experts = split_expert_adapter(peft_state)
    stripped = {key.removeprefix(PEFT_PREFIX): value for key, value in peft_state.items()}
    modules = {key.split(".lora_", 1)[0] for key in stripped}
    scaled = peft_config is not None and "r" in peft_config and "lora_alpha" in peft_config
    scalings = {m: peft_scaling(m, peft_config) for m in modules} if scaled else {}
    lora_alpha = float(peft_config["lora_alpha"]) if scaled else 1.0
    adapter = {}
    if adapter_converter is not None:
        stripped, adapter = adapter_converter.from_peft(stripped, hf_config, lora_alpha, scalings)
    for hf_module, parts in _group_by_module(stripped, _PEFT_TO_TUNE_SUFFIX).items():
        shape = _base_shape(parts, hf_module, "lora_A.weight", "lora_B.weight")
        prefix = _map_module(hf_module, shape, converter, hf_config)
        rank = parts["lora_A.weight"].shape[0]
        factor = scalings.get(hf_module, lora_alpha / rank) / (lora_alpha / rank)
        for suffix, value in parts.items():
            if suffix == "lora_B.weight" and factor != 1:
                value = value * factor
            adapter[f"{prefix}.{_PEFT_TO_TUNE_SUFFIX[suffix]}"] = value
    adapter.update(experts)
    return adapter


def merge_adapter(state_dict: Mapping[str, torch.Tensor], lora_alpha: float) -> dict[str, torch.Tensor]:
    """Folds LoRA/DoRA adapters into their base weights, returning a plain model state dict.

    LoRA: ``W + (alpha / r) B A``. DoRA: ``m / ||W + (alpha / r) B A||_row * (W + (alpha / r) B A)``. Each module's
    rank ``r`` is read from its ``lora_a`` shape. The math runs in fp32 and the result takes the base weight's dtype
    (NF4 bases are dequantised).

    Args:
        state_dict (Mapping[str, torch.Tensor]): a LoRA model's state dict (base and adapter keys).
        lora_alpha (float): the adapters' alpha.

    Returns:
        dict[str, torch.Tensor]: base keys only, adapters merged.

    Raises:
        ValueError: if an adapter's base weight is missing.
    """
    state_dict = merge_lora_experts_state_dict(state_dict, lora_alpha)  # the stacked experts' adapters
    base, adapter = split_adapter(state_dict)
    merged = dict(base)
    for prefix, parts in _group_by_module(adapter, _TUNE_TO_PEFT_SUFFIX).items():
        key = f"{prefix}.weight"
        if key not in base:
            raise ValueError(f"Cannot merge the adapter of {prefix!r}: its base weight {key!r} is missing.")
        weight = dequantize(base[key])
        rank = parts["lora_a.weight"].shape[0]
        delta = (lora_alpha / rank) * (parts["lora_b.weight"].float() @ parts["lora_a.weight"].float())
        adapted = weight.float() + delta
        if "magnitude" in parts:
            norm = torch.linalg.norm(adapted, dim=1)  # [out_dim]
            adapted = (parts["magnitude"].float() / norm).view(-1, 1) * adapted
        merged[key] = adapted.to(weight.dtype)
    return merged
