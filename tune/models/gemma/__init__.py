"""``tune.models.gemma``: the names torchtune's Gemma 2 configs take from torchtune's ``gemma`` package.

torchtune 0.6.1's ``gemma2/*.yaml`` configs build their tokenizer with ``torchtune.models.gemma.gemma_tokenizer``
(Gemma 1 and Gemma 2 share one SentencePiece tokenizer). tune ships Gemma 2 only, so this package is not a model
family: it declares ``ALIAS_OF = "gemma2"`` instead of a ``FAMILY``, the registry skips it, and each name is
looked up in :mod:`tune.models.gemma2` on first access (importing this package imports nothing). Gemma 1 model
builders (``gemma_2b``, ``lora_gemma_7b``, ...) are not provided; ``docs/migrating.md`` lists the difference.
"""

import importlib

# the family this package forwards to; read by tune.registry, which registers no family for an alias package
ALIAS_OF = "gemma2"

__all__ = ["GemmaTokenizer", "gemma_tokenizer"]


def __getattr__(name: str):
    # PEP 562: resolved lazily, so a broken gemma2 family is reported once, by the registry, under its own name
    if name in __all__:
        return getattr(importlib.import_module("tune.models.gemma2"), name)
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r}: tune ships Gemma 2 only, and tune.models.gemma holds just "
        f"the tokenizer torchtune's Gemma 2 configs name ({', '.join(__all__)}); use tune.models.gemma2 instead"
    )


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
