"""A one-line progress bar for long commands, drawn only on a terminal.

On a terminal the line is redrawn in place at most five times a second: the stage, a bar, rows
done of the total, bytes written, the rate and the time left. Anywhere else (a pipe, a file, a CI
log) nothing is drawn, so a log holds only the command's final line.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

__all__ = ["Progress", "human_bytes", "human_duration", "json_safe"]

_WIDTH = 24


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_duration(seconds: float) -> str:
    """``90`` -> ``"90.0 s"``, ``600`` -> ``"10.0 min"``, ``7200`` -> ``"2.0 h"``; ``"?"`` when not finite."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in dicts and lists) made None: JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``progress(stage, rows_done, rows_total, bytes_written)`` draws the bar (see the module).

    Args:
        stream: where to draw (stderr).
        enabled: draw at all; None: only when ``stream`` is a terminal and ``$CI`` is unset.
        labels: stage -> the words shown for it.
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)()) and not os.environ.get("CI")
        self.enabled = enabled
        self.labels = labels or {}
        self._stage = ""
        self._stage_began = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def __call__(self, stage: str, rows: int, total: int, nbytes: int) -> None:
        """Redraw the line (at most every 0.2 s, and at the end of a stage)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if stage != self._stage:
            # The first stage runs from the start (its first rows took the count); a later one from its first call.
            if self._stage:
                self._stage_began = now
            self._stage = stage
        if now - self._last < 0.2 and rows < total:
            return
        self._last = now
        self.stream.write("\r\033[K" + self.line(stage, rows, total, nbytes, now - self._stage_began))
        self.stream.flush()
        self._drawn = True

    def line(self, stage: str, rows: int, total: int, nbytes: int, elapsed_s: float) -> str:
        """The bar's text for these numbers."""
        frac = min(1.0, rows / total) if total else 1.0
        filled = int(frac * _WIDTH)
        rate = rows / elapsed_s if elapsed_s > 0 else 0.0
        eta = _clock((total - rows) / rate) if rate > 0 and rows < total else "--:--"
        written = f"  {human_bytes(nbytes)}" if nbytes else ""
        return (f"{self.labels.get(stage, stage)} [{'#' * filled}{'.' * (_WIDTH - filled)}] {frac:4.0%} "
                f"{rows:,}/{total:,} rows{written}  {rate:,.0f} rows/s  ETA {eta}")

    def close(self) -> None:
        """Erase the bar, so the final line starts on a clean line."""
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
