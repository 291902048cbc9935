"""Tokens and labels from torchtune 0.6.1 itself, for tests/recipes/test_torchtune_tokens.py.

Run as a script with the torchtune wheel on ``PYTHONPATH`` (a wheel is a zip archive Python imports from); it reads
a JSON list of cases on stdin and writes one JSON list of results on stdout. A case is either

- ``{"tokenizer": {...}, "conversations": [[{"role", "content", "masked"}, ...], ...]}``: the tokens and mask of
  ``tokenize_messages`` for each conversation (the message of the ValueError torchtune raises, for one it
  refuses), or
- ``{"tokenizer": {...}, "dataset": {"component": dotted name, "kwargs": {...}}, "count": n}``: ``tokens`` and
  ``labels`` of the first ``n`` samples of the dataset builder, built with that tokenizer (the message of the
  ValueError torchtune raises, for a row it refuses),

where a tokenizer is ``{"component": dotted name, "kwargs": {...}}``. torchtune 0.6.1 imports
``torchao.dtypes.nf4tensor``, which newer torchao releases moved; the module is aliased to its new place first.
"""

import importlib
import json
import sys


def _component(name: str):
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _alias_moved_torchao_modules() -> None:
    try:
        importlib.import_module("torchao.dtypes.nf4tensor")
    except ImportError:
        moved = importlib.import_module("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
        sys.modules["torchao.dtypes.nf4tensor"] = moved


def _run(case: dict) -> list:
    from torchtune.data import Message

    spec = case["tokenizer"]
    tokenizer = _component(spec["component"])(**spec["kwargs"])
    if "dataset" in case:
        dataset = _component(case["dataset"]["component"])(tokenizer, **case["dataset"]["kwargs"])
        try:
            samples = [dataset[i] for i in range(case["count"])]
        except ValueError as e:
            return str(e)
        return [[list(map(int, s["tokens"])), list(map(int, s["labels"]))] for s in samples]
    out = []
    for conversation in case["conversations"]:
        messages = [Message(role=m["role"], content=m["content"], masked=m["masked"]) for m in conversation]
        try:
            tokens, mask = tokenizer.tokenize_messages(messages)
        except ValueError as e:  # a conversation the template refuses: its message
            out.append(str(e))
            continue
        out.append([list(map(int, tokens)), list(map(bool, mask))])
    return out


def main() -> None:
    _alias_moved_torchao_modules()
    cases = json.load(sys.stdin)
    json.dump([_run(case) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
