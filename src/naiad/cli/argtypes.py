"""Argument types the subcommands share: bounded numbers, with errors that show the text given."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["at_least"]


def at_least(minimum: float, kind: type[int] | type[float] = int) -> Callable[[str], int | float]:
    """An ``argparse`` type: ``kind`` (int: ``_`` and ``,`` separators allowed) of at least ``minimum``."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = int(text.replace("_", "").replace(",", "")) if kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {noun} >= {minimum:g}, got {text!r}")
        return value

    parse.__name__ = f"{kind.__name__}>={minimum:g}"
    return parse
