"""Token streams for language-model training: token files as windows (:func:`read_tokens`) and
weighted mixtures of them (:func:`mix`), both map-style datasets for naiad's DataLoader
(docs/TOKENS.md)."""

from __future__ import annotations

from naiad.tokens.files import TokenFile
from naiad.tokens.mixture import MixtureStats, SourceStats, TokenMixture, mix
from naiad.tokens.windows import TokenWindows, read_tokens

__all__ = ["MixtureStats", "SourceStats", "TokenFile", "TokenMixture", "TokenWindows", "mix", "read_tokens"]
