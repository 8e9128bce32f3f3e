"""What ``naiad bench`` reports: one run's measurements, the side-by-side table, the plot."""

from __future__ import annotations

import importlib
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RunResult", "format_table", "load_pyplot", "plot_waits"]


@dataclass
class RunResult:
    """One measured run of a loop.

    Attributes:
        name: "serial" or "naiad".
        waits_s: per step, the time the loop waited for its batch (exposed loading).
        steps_s: per step, the time of the training step.
        total_s: wall time of the measured steps.
        load_s: time spent loading, whether exposed or in the background (None: unknown).
        stats: the loader's own stats, when it keeps them.
        how: the loop, in words.
    """

    name: str
    waits_s: list[float] = field(default_factory=list)
    steps_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    load_s: float | None = None
    stats: dict[str, Any] | None = None
    how: str = ""

    @property
    def steps(self) -> int:
        """Measured steps."""
        return len(self.waits_s)

    def per_step_ms(self, total: float | None) -> float | None:
        """``total`` seconds as milliseconds per measured step."""
        return None if total is None or not self.steps else total / self.steps * 1e3

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary, per-step series included."""
        waits = np.asarray(self.waits_s) if self.waits_s else np.zeros(1)
        return {
            "name": self.name,
            "steps": self.steps,
            "total_s": self.total_s,
            "per_step_ms": self.per_step_ms(self.total_s),
            "load_ms_per_step": self.per_step_ms(self.load_s),
            "wait_ms_per_step": self.per_step_ms(sum(self.waits_s)),
            "step_ms_per_step": self.per_step_ms(sum(self.steps_s)),
            "wait_p50_ms": float(np.percentile(waits, 50)) * 1e3,
            "wait_p99_ms": float(np.percentile(waits, 99)) * 1e3,
            "waits_ms": [w * 1e3 for w in self.waits_s],
            "loader_stats": self.stats,
            "how": self.how,
        }


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, spec)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return ""
    return f"{a / b:.2f}x"


def format_table(results: list[RunResult], header: str) -> str:
    """The side-by-side table ``naiad bench`` prints."""
    serial, ours = results
    rows: list[tuple[str, float | None, float | None, bool]] = [
        ("total s", serial.total_s, ours.total_s, True),
        ("per step ms", serial.per_step_ms(serial.total_s), ours.per_step_ms(ours.total_s), True),
        (
            "data loading ms/step",
            serial.per_step_ms(serial.load_s),
            ours.per_step_ms(ours.load_s),
            False,
        ),
        (
            "exposed wait ms/step",
            serial.per_step_ms(sum(serial.waits_s)),
            ours.per_step_ms(sum(ours.waits_s)),
            True,
        ),
        (
            "training step ms/step",
            serial.per_step_ms(sum(serial.steps_s)),
            ours.per_step_ms(sum(ours.steps_s)),
            False,
        ),
    ]
    width = 24
    lines = [header, "", f"{'':<{width}}{'serial':>12}{'naiad':>12}{'serial/naiad':>14}"]
    for label, a, b, ratio in rows:
        lines.append(
            f"{label:<{width}}{_fmt(a, '.3f' if label == 'total s' else '.2f'):>12}"
            f"{_fmt(b, '.3f' if label == 'total s' else '.2f'):>12}{_ratio(a, b) if ratio else '':>14}"
        )
    for q in (50, 99):
        a = float(np.percentile(serial.waits_s, q)) * 1e3 if serial.waits_s else None
        b = float(np.percentile(ours.waits_s, q)) * 1e3 if ours.waits_s else None
        lines.append(f"{f'wait p{q} ms':<{width}}{_fmt(a):>12}{_fmt(b):>12}")
    share = [sum(r.waits_s) / r.total_s if r.total_s > 0 else None for r in results]
    lines.append(
        f"{'time spent waiting':<{width}}{_fmt(None if share[0] is None else share[0] * 100, '.1f') + '%':>12}"
        f"{_fmt(None if share[1] is None else share[1] * 100, '.1f') + '%':>12}"
    )
    lines += [
        "",
        f"serial: {serial.how}.",
        f"naiad: {ours.how}.",
        "Data loading counts all loading work (naiad: in the background, summed over its stages);",
        "exposed wait is the part the training loop waited for.",
    ]
    return "\n".join(lines)


def load_pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def plot_waits(results: list[RunResult], path: str, title: str, plt: Any) -> None:
    """Draw each run's wait per step, in ms, against the step number."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in results:
        ax.plot(range(r.steps), [w * 1e3 for w in r.waits_s], label=r.name, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("wait for data (ms)")
    ax.set_title(textwrap.fill(title, 110), fontsize=8)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
