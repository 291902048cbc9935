"""torchtune's ``torchtune.modules.transforms`` path: the :class:`Transform` protocol of sample transforms and
:class:`VisionCrossAttentionMask`; ``.vision_utils`` holds the image tiling helpers.

tune keeps its tokenizers and message transforms in ``tune.data``; this package (and ``.tokenizers``) gives them
their torchtune names so that code moved from torchtune by changing the prefix keeps working.
"""

from collections.abc import Mapping
from typing import Any, Protocol

from tune.modules.transforms._vision_cross_attention_mask import VisionCrossAttentionMask


class Transform(Protocol):
    """A sample transform: takes a sample dict and returns the updated one (message transforms, tokenizers)."""

    def __call__(self, sample: Mapping[str, Any]) -> Mapping[str, Any]: ...


__all__ = ["Transform", "VisionCrossAttentionMask"]
