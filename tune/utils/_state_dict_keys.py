"""Renaming the keys of a state dict by module-path prefix rules (Hugging Face <-> tune layouts)."""

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Keys some checkpoints carry that are recomputed, never loaded (old Llama exports saved the RoPE frequencies).
_IGNORED_HF_KEYS = re.compile(r".*rotary_emb\.inv_freq$")


def invert_rules(rules: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Turns HF->tune prefix rules into tune->HF rules (the patterns use ``(\\d+)`` for the layer index only)."""
    inverted = []
    for hf_pattern, tune_prefix in rules:
        tune_pattern = re.escape(tune_prefix.replace(r"\1", "LAYER")).replace("LAYER", r"(\d+)")
        hf_prefix = hf_pattern.replace(r"(\d+)", r"\1").replace("\\.", ".")
        inverted.append((tune_pattern, hf_prefix))
    return tuple(inverted)


def rename_keys(
    state_dict: Mapping[str, Any],
    rules: Iterable[tuple[str, str]],
    *,
    source: str = "Hugging Face",
    skip: re.Pattern | None = None,
    hint: str = "The checkpoint does not match this model family's architecture; check config.json's model_type.",
) -> dict[str, Any]:
    """Renames the module-path prefix of every key with the first matching rule.

    Args:
        state_dict (Mapping[str, Any]): the state dict to convert.
        rules (Iterable[tuple[str, str]]): ``(prefix regex, replacement)`` pairs, tried in order.
        source (str): name of the input format, for the error message.
        skip (re.Pattern | None): keys dropped besides saved RoPE frequencies. Default None.
        hint (str): what the error says after listing the unknown keys.

    Returns:
        dict[str, Any]: a new dict with renamed keys and the same values.

    Raises:
        ValueError: listing the keys no rule matches.
    """
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    converted, unknown = {}, []
    for key, value in state_dict.items():
        if _IGNORED_HF_KEYS.match(key) or (skip is not None and skip.match(key)):
            continue
        for pattern, replacement in compiled:
            match = pattern.match(key)
            if match:
                converted[match.expand(replacement) + key[match.end() :]] = value
                break
        else:
            unknown.append(key)
    if unknown:
        shown = ", ".join(unknown[:8]) + (" ..." if len(unknown) > 8 else "")
        raise ValueError(f"{len(unknown)} {source} state-dict key(s) have no known mapping: {shown}. {hint}")
    return converted
