"""Training steps for ``naiad bench``: a synthetic one of a given length, or a real small one.

A step is ``step(batch) -> None``. On the CPU the synthetic step sleeps, leaving the core free
as an accelerator would; on CUDA it runs a GPU kernel of that length after reading the batch
(so it is ordered after the batch's copy) and synchronizes, as a step that reads its loss back
does.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from naiad.errors import ConfigError

__all__ = ["RunResult", "Step", "cuda_cycles_per_ms", "speed_ups", "synthetic_step", "training_step"]

Step = Callable[[Any], None]
"""One training step on one batch."""


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else ()
    )
    for v in values:
        t = _first_tensor(v)
        if t is not None:
            return t
    return None


def synthetic_step(step_ms: float, device: torch.device) -> Step:
    """A step that takes ``step_ms``: a sleep on the CPU, a GPU kernel of that length on CUDA.

    The CUDA step reads the batch first (so it is ordered after the batch's copy) and ends
    with a synchronize, as a step that reads its loss back does.
    """
    if device.type != "cuda":
        seconds = step_ms / 1e3

        def sleep_step(batch: Any) -> None:
            time.sleep(seconds)

        return sleep_step
    cycles = int(step_ms * cuda_cycles_per_ms(device))

    def gpu_step(batch: Any) -> None:
        t = _first_tensor(batch)
        if t is not None:
            t.float().sum()
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # torch leaves _sleep unannotated
        torch.cuda.current_stream(device).synchronize()

    return gpu_step


def cuda_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` on ``device`` (median of 3)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]  # warm up the clock (_sleep: unannotated)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        samples: list[float] = []
        for _ in range(3):
            start.record()
            torch.cuda._sleep(10_000_000)  # type: ignore[no-untyped-call]  # unannotated in torch
            end.record()
            end.synchronize()
            samples.append(10_000_000 / start.elapsed_time(end))
    return statistics.median(samples)


def _features(batch: Any) -> torch.Tensor | None:
    """The model input of a batch: a dict's numeric columns side by side, else its first tensor."""
    if isinstance(batch, dict):
        cols = [
            v.reshape(v.shape[0], -1).float()
            for v in batch.values()
            if isinstance(v, torch.Tensor) and v.ndim >= 1 and not v.is_complex()
        ]
        return torch.cat(cols, dim=1) if cols else None
    x = _first_tensor(batch)
    return None if x is None else x.reshape(x.shape[0] if x.ndim else 1, -1).float()


def training_step(device: torch.device) -> Step:
    """A real step: a two-layer MLP on the batch's features, SGD, the loss read back.

    The model is built at the first batch, when the number of features is known.
    """
    parts: list[Any] = []

    def step(batch: Any) -> None:
        x = _features(batch)
        if x is None:
            raise ConfigError("`--train` needs batches with numeric tensors; this source has none.")
        if not parts:
            model = torch.nn.Sequential(
                torch.nn.Linear(x.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
            ).to(x.device)
            parts.extend([model, torch.optim.SGD(model.parameters(), lr=1e-3)])
        model, opt = parts
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # reading the loss back synchronizes, as most training loops do

    return step


@dataclass
class RunResult:
    """What one training run of ``naiad demo`` measured (``naiad demo images`` adds its own)."""

    name: str
    rows: int
    steps: int
    total_s: float
    wait_s: float
    final_loss: float

    @property
    def rows_per_s(self) -> float:
        """Rows trained per second of the whole loop."""
        return self.rows / self.total_s if self.total_s > 0 else float("nan")

    @property
    def wait_per_step_us(self) -> float:
        """Mean time the loop waited for the next batch, in microseconds."""
        return 1e6 * self.wait_s / max(1, self.steps)


def speed_ups(results: Sequence[RunResult]) -> list[str]:
    """A line for each run after the first: its speed-up over the first, in total time and in
    time spent waiting for data (the demos' tables end with them)."""
    base = results[0]
    return [f"speed-up of {r.name}: {base.total_s / r.total_s:.2f}x total time, "
            f"{base.wait_s / max(r.wait_s, 1e-9):.1f}x less time waiting for data" for r in results[1:]]
