"""The loader's state: what ``state_dict()`` says and what ``load_state_dict()`` accepts.

A state is ``{"version", "kind", "epoch", "batches_yielded", "base_seed", "pipeline": {...}}``
(NOTE [ Pipeline seam ] in pipeline.py; docs/CHECKPOINTING.md shows one). It never
raises to be taken: a loader whose order cannot be known (a custom sampler, a RandomSampler
with replacement) says so in the state, ``"resumable": false`` with the reason, and loading
such a state starts its epoch afresh with a warning, as a trainer that checkpoints every
loader expects (torch's own DataLoader has no state at all).

The position is what the training loop received: inside the loop, or after it left the loop
with ``break`` (the pass's iterator dropped), the batches received so far; once every batch of
the epoch was received, the next epoch's start, as in torchdata's StatefulDataLoader.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from naiad.epoch import PassProgress
from naiad.errors import ConfigError, StateError
from naiad.order.elastic import state_int
from naiad.pipeline import STATE_VERSION, Pipeline, PipelinePass

__all__ = ["PassRecord", "build_state", "check_pending", "pass_position", "read_state", "refuse_pending", "resumed_seed"]


@dataclass(frozen=True)
class PassRecord:
    """The last pass a loader opened: kept after its iterator is gone, for ``state_dict``."""

    epoch: int
    run: PipelinePass
    progress: PassProgress
    base_seed: int

    @functools.cached_property
    def length(self) -> int | None:
        """The pass's batches (None: not known). Asked when a state needs it, not when the pass
        opens: a stream's rows may still be being counted then (NOTE [ Early reads ])."""
        try:
            return len(self.run)
        except TypeError:
            return None  # an IterableDataset's pass


def pass_position(last: PassRecord | None, *, iterating: bool, loader_epoch: int, device: bool,
                  pending: int = 0) -> tuple[PassRecord, int] | None:
    """The last pass and the batches the training loop received of it, less ``pending`` (those
    it received and has not trained on), while that pass is where the loader stands (begun and
    not run to its end); else None.

    Args:
        last: the pass last opened.
        iterating: its iterator (or the device prefetcher over it) is still alive.
        loader_epoch: the epoch the loader's next pass would be.
        device: a DevicePrefetcher stood between the pass and the loop.
        pending: batches received and given back (``state_dict(pending=k)``).

    Raises:
        ConfigError: ``pending`` exceeds the batches the loop received of the pass.
    """
    if last is None or (not iterating and loader_epoch != last.epoch + 1):
        # No pass, or set_epoch() moved the loader on since that pass was dropped.
        refuse_pending(pending, 0, "in this epoch")
        return None
    progress = last.progress
    # A DevicePrefetcher reads ahead: the training loop has what it handed over.
    received = progress.received if device else progress.delivered
    refuse_pending(pending, received, "since the pass began" + (" (a resumed one)" if last.run.start else ""))
    if not pending and (received == last.length or (progress.finished and received >= progress.delivered)):
        # Every batch reached the loop (whether or not it has seen StopIteration yet): the
        # next epoch starts afresh, as in torchdata's StatefulDataLoader.
        return None
    return last, received - pending


def check_pending(pending: object) -> int:
    """``state_dict``'s ``pending``, checked: an int >= 0.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(pending, bool) or not isinstance(pending, int) or pending < 0:
        raise ConfigError(f"`pending` must be an int >= 0 (the batches received and not trained on), got {pending!r}.")
    return pending


def refuse_pending(pending: int, received: int, where: str) -> None:
    """Refuse to give back more batches than the loop received ``where``.

    Raises:
        ConfigError: ``pending`` > ``received``.
    """
    if pending > received:
        raise ConfigError(
            f"state_dict(pending={pending}): the training loop received {received} batch(es) {where}, "
            f"so at most {received} can be given back; a state before them is the state taken then."
        )


def build_state(pipeline: Pipeline, position: tuple[PassRecord, int] | None, *, loader_epoch: int,
                seed: int | None) -> dict[str, Any]:
    """The state at ``position`` (None: the start of ``loader_epoch``)."""
    base_seed: int | None
    if position is not None:
        last, received = position
        epoch, batches, base_seed = last.epoch, last.run.start + received, last.base_seed
    else:
        epoch, batches, base_seed = loader_epoch, 0, seed
    state: dict[str, Any] = {
        "version": STATE_VERSION, "kind": pipeline.kind, "epoch": epoch, "batches_yielded": batches,
        "base_seed": base_seed,
    }
    why = pipeline.why_not_resumable()
    if why is not None:
        return {**state, "resumable": False, "reason": why, "pipeline": {}}
    state["pipeline"] = position[0].run.state(position[1]) if position is not None else pipeline.start_state(epoch)
    return state


def read_state(pipeline: Pipeline, state: Any) -> dict[str, Any] | None:
    """Check a state against ``pipeline``: the state to resume from (a copy), or None when its
    epoch must start afresh (saved or loaded where the order cannot be known: warned).

    Raises:
        StateError: naming the stored and the current value, and what to change.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise StateError(
            f"loader state version: stored {got!r}, current {STATE_VERSION}; expected a dict "
            "from naiad.DataLoader.state_dict() of this naiad version."
        )
    if state.get("kind") != pipeline.kind:
        raise StateError(
            f"loader state kind: stored {state.get('kind')!r}, current {pipeline.kind!r}; "
            "the state comes from a loader over another kind of dataset."
        )
    epoch = state_int(state.get("epoch"), "loader state epoch")
    batches = state_int(state.get("batches_yielded"), "loader state batches_yielded")
    base_seed = state.get("base_seed")
    if base_seed is not None:  # torch draws an int64; `seed=` may be any uint64
        state_int(base_seed, "loader state base_seed", -(2**63), 2**64 - 1)
    why = state.get("reason") if state.get("resumable") is False else pipeline.why_not_resumable()
    if why is not None:
        if batches:
            warnings.warn(
                f"naiad: the loader cannot resume epoch {epoch} mid-way ({why}); it starts that "
                f"epoch afresh, so the {batches} batch(es) already delivered will be seen again.",
                stacklevel=3,
            )
        return None
    part = state.get("pipeline")
    if not isinstance(part, Mapping):
        raise StateError(f"loader state pipeline: stored {type(part).__name__}, expected a dict.")
    try:
        pipeline.check_state(part, epoch)
        return copy.deepcopy(state)
    except RecursionError:  # a hostile state nested a thousand deep somewhere
        raise StateError("loader state: nested too deeply to be a state of naiad.DataLoader.") from None


def resumed_seed(resume: dict[str, Any] | None, epoch: int) -> int | None:
    """The base seed a pending resume gives the pass of ``epoch``: the interrupted pass's, or
    None (no resume for that epoch, or a state without one)."""
    if resume is None or resume.get("epoch") != epoch or resume.get("base_seed") is None:
        return None
    return int(resume["base_seed"])
