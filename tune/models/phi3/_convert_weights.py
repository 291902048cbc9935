"""Phi-3 <-> Hugging Face weights and building a model from a Phi-3 ``config.json``.

Hugging Face's Phi-3 fuses the attention input projections into ``qkv_proj`` (rows: all query heads, then key
heads, then value heads) and the gate/up projections into ``gate_up_proj`` (rows: gate, then up). tune keeps
them separate (``q_proj``/``k_proj``/``v_proj``, ``w1``/``w3``) so LoRA can target each; conversion splits and
re-fuses along the output dimension.
"""

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import (
    convert_hf_to_tune,
    convert_tune_to_hf,
    hf_rope_settings,
    hf_sliding_windows,
)
from tune.models.phi3._component_builders import _use_long_rope
from tune.modules import TransformerDecoder

_QKV = re.compile(r"model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight")
_GATE_UP = re.compile(r"model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight")
_TUNE_SPLIT = re.compile(r"layers\.(\d+)\.(attn\.[qkv]_proj|mlp\.w[13])\.weight")


def _head_sizes(hf_config: Mapping[str, Any]) -> tuple[int, int]:
    num_heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // num_heads
    num_kv_heads = hf_config.get("num_key_value_heads") or num_heads
    return num_heads * head_dim, num_kv_heads * head_dim


def _split_fused(
    state_dict: Mapping[str, Any], qkv_sizes: list[int] | None, hf_config: Mapping[str, Any]
) -> dict[str, Any]:
    # qkv_sizes: rows of the query, key and value blocks of qkv_proj; None: three equal blocks
    split, rest = {}, {}
    for key, value in state_dict.items():
        if match := _QKV.fullmatch(key):
            q, k, v = torch.split(value, qkv_sizes, dim=0) if qkv_sizes else value.chunk(3, dim=0)
            layer = match.group(1)
            split.update({f"layers.{layer}.attn.{n}_proj.weight": t for n, t in zip("qkv", (q, k, v), strict=True)})
        elif match := _GATE_UP.fullmatch(key):
            gate, up = value.chunk(2, dim=0)
            split.update({f"layers.{match.group(1)}.mlp.w1.weight": gate, f"layers.{match.group(1)}.mlp.w3.weight": up})
        else:
            rest[key] = value
    return {**convert_hf_to_tune(rest, hf_config), **split}


def phi3_hf_to_tune(
    state_dict: Mapping[str, Any], num_heads: int | None, num_kv_heads: int | None, dim: int | None
) -> dict[str, Any]:
    """Hugging Face Phi-3 state dict -> tune keys, splitting the fused projections (torchtune's signature).

    Args:
        state_dict (Mapping[str, Any]): Hugging Face keys -> tensors.
        num_heads (int | None): query heads; needed with ``dim``.
        num_kv_heads (int | None): key/value heads; needed with ``dim``.
        dim (int | None): rows of the query block of ``qkv_proj`` (the model width); the key and value blocks
            have ``dim * num_kv_heads // num_heads`` rows each. None: three equal blocks (no grouped-query
            attention, as in Phi-3 Mini).

    Returns:
        dict[str, Any]: tune keys -> tensors.

    Raises:
        ValueError: for ``dim`` without ``num_heads`` and ``num_kv_heads``, or keys with no mapping.
    """
    sizes = None
    if dim is not None:
        if num_heads is None or num_kv_heads is None:
            raise ValueError(
                f"phi3_hf_to_tune got dim={dim} but num_heads={num_heads}, num_kv_heads={num_kv_heads}; pass both "
                "head counts to split a grouped-query qkv_proj, or dim=None for three equal blocks."
            )
        kv_dim = dim * num_kv_heads // num_heads
        sizes = [dim, kv_dim, kv_dim]
    return _split_fused(state_dict, sizes, {})


def phi3_hf_to_tune_from_config(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`phi3_hf_to_tune` with the block sizes read from a ``config.json`` dict (the registry's converter).

    Raises:
        ValueError: for keys with no mapping.
    """
    q_dim, kv_dim = _head_sizes(hf_config)
    return _split_fused(state_dict, [q_dim, kv_dim, kv_dim], hf_config)


def phi3_tune_to_hf(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Phi-3 keys, fusing ``q/k/v_proj`` and ``w1/w3`` (torchtune's signature).

    Raises:
        ValueError: if a layer lacks one of the projections to fuse.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _TUNE_SPLIT.fullmatch(key):
            parts.setdefault(match.group(1), {})[match.group(2)] = value
        else:
            rest[key] = value
    fused = {}
    for layer, tensors in parts.items():
        try:
            qkv = [tensors[f"attn.{n}_proj"] for n in "qkv"]
            gate_up = [tensors["mlp.w1"], tensors["mlp.w3"]]
        except KeyError as missing:
            raise ValueError(f"Layer {layer} lacks {missing} needed to build Phi-3's fused projections.") from None
        fused[f"model.layers.{layer}.self_attn.qkv_proj.weight"] = torch.cat(qkv, dim=0)
        fused[f"model.layers.{layer}.mlp.gate_up_proj.weight"] = torch.cat(gate_up, dim=0)
    return {**convert_tune_to_hf(rest), **fused}


def phi3_tune_to_hf_from_config(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`phi3_tune_to_hf` with the registry's converter signature (the config is not needed)."""
    return phi3_tune_to_hf(state_dict)


def phi3_long_rope_settings(hf_config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE theta and, for ``longrope`` scaling, the ``rope_scaling`` argument of :func:`phi3` from a
    ``config.json`` dict (transformers 4's ``rope_scaling`` or 5's ``rope_parameters``).

    ``scale_factor`` is the config's ``factor`` when given, else ``max_position_embeddings /
    original_max_position_embeddings``, and ``attention_factor`` is passed on when the config sets it: the values
    transformers uses.

    Returns:
        tuple[float, dict[str, Any] | None]: theta, and the LongRoPE arguments (None for unscaled RoPE).

    Raises:
        ValueError: for another scaling type, or a longrope entry without its factor lists.
    """
    theta, scaling = hf_rope_settings(hf_config)
    if scaling is None:
        return theta, None
    if scaling["rope_type"] not in ("longrope", "su"):  # "su": the name of the first 128k releases
        raise ValueError(
            f"phi3: RoPE scaling {scaling['rope_type']!r} in config.json is not supported; supported: default "
            "(no rope_scaling) and longrope."
        )
    missing = [key for key in ("short_factor", "long_factor") if not scaling.get(key)]
    original = scaling.get("original_max_position_embeddings") or hf_config.get("original_max_position_embeddings")
    if original is None:
        missing.append("original_max_position_embeddings")
    if missing:
        raise ValueError(f"config.json's longrope rope_scaling lacks {missing}.")
    max_positions = hf_config.get("max_position_embeddings", original)
    long_rope = {
        "short_factor": [float(f) for f in scaling["short_factor"]],
        "long_factor": [float(f) for f in scaling["long_factor"]],
        "original_max_seq_len": int(original),
        "scale_factor": float(scaling.get("factor") or max_positions / original),
    }
    if scaling.get("attention_factor") is not None:
        long_rope["attention_factor"] = float(scaling["attention_factor"])
    return theta, long_rope


def read_long_rope_factors(path: str | Path) -> dict[str, Any]:
    """The LongRoPE arguments of a Phi-3 ``config.json`` (a file, or the checkpoint directory holding it).

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: if the file is not JSON or its RoPE is not longrope.
    """
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"No config.json at {str(path)!r}: pass the config.json of the Phi-3 128k checkpoint (or its directory), "
            "e.g. from `tune download microsoft/Phi-3-mini-128k-instruct`."
        )
    try:
        hf_config = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON ({error}).") from None
    _, long_rope = phi3_long_rope_settings(hf_config)
    if long_rope is None:
        raise ValueError(f"{file} has no longrope rope_scaling: it is not the config of a 128k-context Phi-3.")
    return long_rope


def phi3_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Phi-3 (or Phi-4) model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: phi3``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised; with :class:`~tune.modules.LongRoPE` when the
        config's RoPE scaling is ``longrope`` (the 128k-context models).

    Raises:
        ValueError: for RoPE scaling other than longrope, or partial rotary embeddings (Phi-4-mini), which tune's
            Phi-3 does not implement.
    """
    rope = dict(hf_config.get("rope_parameters") or {})
    if rope.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json uses partial_rotary_factor != 1 (Phi-4-mini); tune's Phi-3 rotates full heads.")
    rope_base, long_rope = phi3_long_rope_settings(hf_config)
    num_heads = hf_config["num_attention_heads"]
    model = build_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=hf_config["hidden_size"],
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 4096),
        head_dim=hf_config.get("head_dim"),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-5),
        rope_base=rope_base,
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        sliding_windows=hf_sliding_windows(hf_config, "all"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
    return _use_long_rope(model, long_rope, rope_base)


# ---------------------------------------------------------------------------------------------------------------
# LoRA adapters <-> PEFT on the fused projections
# ---------------------------------------------------------------------------------------------------------------

# fused HF module (after "model.layers.N.") -> tune's projections, in the fused row order
_FUSED = {
    "self_attn.qkv_proj": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.w1", "mlp.w3"),
}
_TUNE_ADAPTER = re.compile(r"layers\.(\d+)\.(attn\.[qkv]_proj|mlp\.w[13])\.(lora_a\.weight|lora_b\.weight|magnitude)")
_PEFT_ADAPTER = re.compile(
    r"model\.layers\.(\d+)\.(self_attn\.qkv_proj|mlp\.gate_up_proj)\."
    r"(lora_A\.weight|lora_B\.weight|lora_magnitude_vector(?:\.weight)?)"
)
_UNSPLITTABLE = (
    "tune's Phi-3 keeps q/k/v and gate/up apart, so it can only take a fused LoRA that is per-projection LoRAs side "
    "by side (rank a multiple of {n}, lora_B block-diagonal), as tune writes them. Merge this adapter into the "
    "model with PEFT (merge_and_unload), save it, and train or load that model instead."
)


def _fused_out_dims(fused: str, hf_config: Mapping[str, Any]) -> list[int]:
    if fused == "self_attn.qkv_proj":
        q_dim, kv_dim = _head_sizes(hf_config)
        return [q_dim, kv_dim, kv_dim]
    return [hf_config["intermediate_size"]] * 2


def phi3_adapter_to_peft(
    adapter: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any], lora_alpha: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """Fuses tune's per-projection LoRAs on q/k/v (and gate/up) into one LoRA on ``qkv_proj`` (``gate_up_proj``).

    LoRAs of rank ``r`` on each projection are exactly one LoRA of rank ``n * r`` on the fused projection: ``A``
    stacks the projections' ``A`` along the rank dimension, ``B`` places their ``B`` on the block diagonal, and a
    projection without LoRA gets zero blocks. The fused module's alpha is ``n * lora_alpha``, which keeps each
    block's scaling at ``lora_alpha / r``. DoRA magnitudes are per output row, so they are concatenated.

    Args:
        adapter (Mapping[str, torch.Tensor]): tune adapter weights (``layers.0.attn.q_proj.lora_a.weight``, ...).
        hf_config (Mapping[str, Any]): the ``config.json`` dict.
        lora_alpha (float): the adapters' alpha.

    Returns:
        tuple: the adapter weights of other modules (tune keys), the fused PEFT weights
        (``model.layers.0.self_attn.qkv_proj.lora_A.weight``, ...), and each fused module's rank and alpha.

    Raises:
        ValueError: when the projections of one fused module have different ranks, or DoRA covers only some.
    """
    groups: dict[tuple[str, str], dict[str, dict[str, torch.Tensor]]] = {}
    rest = {}
    for key, value in adapter.items():
        match = _TUNE_ADAPTER.fullmatch(key)
        if match is None:
            rest[key] = value
            continue
        layer, projection, suffix = match.groups()
        fused = next(name for name, parts in _FUSED.items() if projection in parts)
        groups.setdefault((layer, fused), {}).setdefault(projection, {})[suffix] = value
    peft_state, ranks, alphas = {}, {}, {}
    for (layer, fused), found in groups.items():
        module = f"model.layers.{layer}.{fused}"
        weights = _fuse(module, [found.get(p, {}) for p in _FUSED[fused]], _fused_out_dims(fused, hf_config))
        peft_state.update({f"{module}.{suffix}": value for suffix, value in weights.items()})
        ranks[module] = weights["lora_A.weight"].shape[0]
        alphas[module] = lora_alpha * len(_FUSED[fused])
    return rest, peft_state, ranks, alphas


def _fuse(module: str, parts: list[dict[str, torch.Tensor]], out_dims: list[int]) -> dict[str, torch.Tensor]:
    present = [p for p in parts if "lora_a.weight" in p and "lora_b.weight" in p]
    ranks = {p["lora_a.weight"].shape[0] for p in present}
    if len(ranks) != 1 or len(present) != sum(bool(p) for p in parts):
        raise ValueError(
            f"Cannot fuse the LoRAs of {module}: its projections need lora_a and lora_b of one rank each, got ranks "
            f"{[tuple(p['lora_a.weight'].shape)[0] if 'lora_a.weight' in p else None for p in parts]}."
        )
    if any("magnitude" in p for p in parts) and not all("magnitude" in p for p in parts):
        raise ValueError(
            f"Cannot save the DoRA adapter of {module} for PEFT: DoRA must be on all of its projections "
            f"({', '.join(_FUSED[module.split('.', 3)[-1]])}) or none, since PEFT normalises the fused weight."
        )
    rank = ranks.pop()
    sample = present[0]["lora_a.weight"]
    in_dim = sample.shape[1]
    lora_a = torch.zeros(rank * len(parts), in_dim, dtype=sample.dtype, device=sample.device)
    lora_b = torch.zeros(sum(out_dims), rank * len(parts), dtype=sample.dtype, device=sample.device)
    row = 0
    for i, (part, out_dim) in enumerate(zip(parts, out_dims, strict=True)):
        if part:
            lora_a[i * rank : (i + 1) * rank] = part["lora_a.weight"]
            lora_b[row : row + out_dim, i * rank : (i + 1) * rank] = part["lora_b.weight"]
        row += out_dim
    fused = {"lora_A.weight": lora_a, "lora_B.weight": lora_b}
    if "magnitude" in parts[0]:
        fused["lora_magnitude_vector"] = torch.cat([p["magnitude"] for p in parts])
    return fused


def phi3_peft_to_adapter(
    peft_state: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    lora_alpha: float,
    scalings: Mapping[str, float],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Splits LoRAs on ``qkv_proj``/``gate_up_proj`` back into tune's per-projection LoRAs (the inverse of
    :func:`phi3_adapter_to_peft`), where that is exact.

    The fused rank ``R`` is split into ``n`` equal blocks, one per projection; ``lora_B`` must be zero outside the
    block diagonal. A projection whose blocks of ``A`` and ``B`` are both zero had no LoRA and is left out. Each
    ``B`` block is rescaled from the fused module's scaling to tune's ``lora_alpha / (R / n)``.

    Args:
        peft_state (Mapping[str, torch.Tensor]): PEFT weights without the ``base_model.model.`` prefix.
        hf_config (Mapping[str, Any]): the ``config.json`` dict.
        lora_alpha (float): the alpha of tune's LoRA layers (PEFT's ``lora_alpha``).
        scalings (Mapping[str, float]): PEFT's ``alpha / r`` by module; a module not listed keeps its weights.

    Returns:
        tuple: the PEFT weights of other modules, and tune adapter weights for the fused ones.

    Raises:
        ValueError: when a fused LoRA is not per-projection LoRAs side by side (the message says what to do).
    """
    groups: dict[str, dict[str, torch.Tensor]] = {}
    rest = {}
    for key, value in peft_state.items():
        match = _PEFT_ADAPTER.fullmatch(key)
        if match is None:
            rest[key] = value
            continue
        layer, fused, suffix = match.groups()
        groups.setdefault(f"model.layers.{layer}.{fused}", {})[suffix.removesuffix(".weight") + ".weight"] = value
    adapter = {}
    for module, weights in groups.items():
        _, _, layer, fused = module.split(".", 3)
        projections = _FUSED[fused]
        if "lora_A.weight" not in weights or "lora_B.weight" not in weights:
            raise ValueError(f"PEFT adapter of {module} lacks lora_A or lora_B; found {sorted(weights)}.")
        lora_a, lora_b = weights["lora_A.weight"], weights["lora_B.weight"]
        out_dims = _fused_out_dims(fused, hf_config)
        num_parts = len(projections)
        if lora_a.shape[0] % num_parts or lora_b.shape[0] != sum(out_dims):
            raise ValueError(
                f"The LoRA on {module} has rank {lora_a.shape[0]} and {lora_b.shape[0]} output rows. "
                + _UNSPLITTABLE.format(n=num_parts)
            )
        rank = lora_a.shape[0] // num_parts
        factor = scalings.get(module, lora_alpha / rank) / (lora_alpha / rank)
        magnitude = weights.get("lora_magnitude_vector.weight")
        row = 0
        for i, (projection, out_dim) in enumerate(zip(projections, out_dims, strict=True)):
            rows, cols = slice(row, row + out_dim), slice(i * rank, (i + 1) * rank)
            row += out_dim
            block_b = lora_b[rows]
            outside = torch.cat([block_b[:, : cols.start], block_b[:, cols.stop :]], dim=1)
            if outside.count_nonzero():
                raise ValueError(
                    f"The LoRA on {module} mixes projections (lora_B is not block-diagonal). "
                    + _UNSPLITTABLE.format(n=num_parts)
                )
            part_a, part_b = lora_a[cols], block_b[:, cols]
            if magnitude is None and not part_a.count_nonzero() and not part_b.count_nonzero():
                continue  # written for a projection without LoRA
            prefix = f"layers.{layer}.{projection}"
            adapter[f"{prefix}.lora_a.weight"] = part_a.contiguous()
            adapter[f"{prefix}.lora_b.weight"] = (part_b * factor).contiguous() if factor != 1 else part_b.contiguous()
            if magnitude is not None:
                adapter[f"{prefix}.magnitude"] = magnitude[rows].contiguous()
    return rest, adapter
