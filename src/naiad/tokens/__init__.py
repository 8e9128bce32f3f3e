"""Token streams for language-model training: token files as windows (:func:`read_tokens`) and
weighted mixtures of them (:func:`mix`), raw text tokenized and packed (:func:`tokenize`), both map-style datasets for naiad's DataLoader
(docs/TOKENS.md)."""

from __future__ import annotations

from naiad.tokens.files import TokenFile
from naiad.tokens.mixture import MixtureStats, SourceStats, TokenMixture, mix
from naiad.tokens.text import Tokenize, TokenizedSource, tokenize
from naiad.tokens.windows import TokenWindows, read_tokens

__all__ = ["MixtureStats", "SourceStats", "TokenFile", "TokenMixture", "TokenWindows", "Tokenize", "TokenizedSource", "mix", "read_tokens", "tokenize"]
