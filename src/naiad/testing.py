"""Conformance checks to run on your own loaders: does a saved position resume exactly? Does a
streaming configuration deliver every row exactly once (:func:`check_coverage`, from
:mod:`naiad.tools.coverage`; ``naiad check`` on the command line)?

:func:`check_resume` is the check naiad runs on every source and mode of its own (the project's
``tests/integration/test_resume_conformance.py``); run it on your dataset and configuration,
in your test suite, before you trust a checkpoint with it. It needs no test framework: a
mismatch is an ``AssertionError`` that says which epoch, which batch and what differs.

NOTE [ What check_resume checks ]
A reference loader runs epochs ``0 .. epochs-1`` uninterrupted and its batches are recorded
(copied, so that later passes cannot change them). Then, for each *save point*, a fresh loader
from ``make_loader()`` runs up to that point, the state is taken there, and another fresh loader
that loaded the state (after a JSON round trip, as a checkpoint file does) must yield exactly
the rest: the remaining batches of that epoch, then every following epoch, batch for batch
(types, nesting, dtypes, shapes, values, order). Once every batch of an epoch has reached the
loop, the rest is the next epoch, whether or not the loop has seen the epoch's end. The save
points:

* ``break``: in epoch 0, after ``k`` batches, the state is taken inside the loop and the loop
  ``break``s, as a training loop does at a checkpoint; ``k`` is 0 (the pass has started, no
  batch yet), 1, the middle, all but one, and all of them (``positions`` picks others). Taken
  again after the ``break`` (the pass's iterator dropped), the state must not have moved.
* ``resumed, then saved again``: the loader resumed from the middle takes its own state after
  one more batch; that state resumes exactly too (a second preemption in the same epoch).
* ``continue``: in the middle of epoch 0 without breaking; the same loader then goes on and
  must be undisturbed: the rest of its epochs are the reference's too.
* ``end of epoch``: after epoch 0's loop ran to its end; the resumed loader starts at epoch 1.
* ``later epoch``: in the middle of the last epoch, after whole epochs before it.

Every state must be plain JSON (``json.dumps`` with no NaN, and equal to itself after a round
trip), small (``max_state_bytes``), the same when taken twice in a row, and what the loader
that loaded it reports until its first batch.

A loader made with ``in_order=False`` delivers its batches as workers finish them, so their
order within an epoch is not repeatable. For such a loader each batch is matched against the
reference batches of its epoch not yet received, whatever their place: the batches received
before the state plus those after the resume must be the epoch's batches, each exactly once.
Epochs still follow each other in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from naiad.errors import ConfigError
from naiad.tools.batch_compare import first_difference, snapshot
from naiad.tools.coverage import CoverageReport, EpochCoverage, ShuffleQuality, check_coverage

__all__ = [
    "CoverageReport", "EpochCoverage", "ResumeReport", "SavePoint", "ShuffleQuality", "check_coverage", "check_resume",
    "first_difference",
]


@dataclass(frozen=True)
class SavePoint:
    """One place a state was taken and resumed from.

    Attributes:
        epoch: the epoch the consumer was in.
        batches: batches of that epoch the consumer had received when the state was taken.
        how: ``"break"``, ``"resumed, then saved again"``, ``"continue"``, ``"end of epoch"``
            or ``"later epoch"`` (see NOTE [ What check_resume checks ]).
        state_bytes: the size of the state as JSON.
    """

    epoch: int
    batches: int
    how: str
    state_bytes: int

    def __str__(self) -> str:
        return f"epoch {self.epoch} after {self.batches} batch(es) ({self.how})"


@dataclass(frozen=True)
class ResumeReport:
    """What :func:`check_resume` checked; every check passed.

    Attributes:
        epochs: epochs in the reference run.
        batches_per_epoch: the reference's batch count in each epoch.
        save_points: every position a state was taken and resumed from.
        batches_compared: batches compared with the reference, over all runs.
        largest_state_bytes: the largest state seen, as JSON.
    """

    epochs: int
    batches_per_epoch: tuple[int, ...]
    save_points: tuple[SavePoint, ...]
    batches_compared: int
    largest_state_bytes: int

    def __str__(self) -> str:
        points = "; ".join(str(p) for p in self.save_points)
        return (
            f"resume checked at {len(self.save_points)} save points over {self.epochs} epoch(s) of "
            f"{list(self.batches_per_epoch)} batches, {self.batches_compared} batches compared, "
            f"states up to {self.largest_state_bytes} bytes: {points}"
        )


def check_resume(
    make_loader: Callable[[], Any],
    *,
    epochs: int = 2,
    positions: Sequence[float] | None = None,
    max_state_bytes: int = 16_384,
) -> ResumeReport:
    """Check that a loader's ``state_dict()`` resumes exactly, at the start, middle and end of
    an epoch (see NOTE [ What check_resume checks ] in this module).

    ``make_loader`` must build the same loader each time: same data, same arguments, and an
    order that repeats (``seed=`` when shuffling). Keep the data small: the check runs the
    epochs about ``len(positions) + 6`` times.

    Args:
        make_loader: a zero-argument callable returning a fresh :class:`naiad.DataLoader`.
        epochs: epochs in the reference run (>= 1); the resumed runs go on to its end.
        positions: where in epoch 0 to ``break`` and resume, as fractions of the epoch's
            batches (0.0: the pass has started, no batch yet; 1.0: every batch received, the
            loop not yet ended). Default: before the first batch, after the first, the middle,
            all but the last, and after the last.
        max_state_bytes: the largest state (as JSON) accepted.

    Returns:
        A :class:`ResumeReport` of what was checked.

    Raises:
        AssertionError: a state is not plain JSON or too large, or a resumed run differs from
            the reference; the message names the save point, the epoch, the batch and what
            differs.
        ConfigError: a bad argument.

    Example:
        >>> import torch, naiad
        >>> from naiad.testing import check_resume
        >>> ds = torch.utils.data.TensorDataset(torch.arange(10.0))
        >>> report = check_resume(lambda: naiad.DataLoader(ds, batch_size=3, shuffle=True, seed=0))
        >>> report.batches_per_epoch, len(report.save_points)
        ((4, 4), 9)
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"`epochs` must be an int >= 1, got {epochs!r}.")
    if isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int) or max_state_bytes < 1:
        raise ConfigError(f"`max_state_bytes` must be an int >= 1, got {max_state_bytes!r}.")
    fractions = _fractions(positions)
    checker = _Checker(make_loader, epochs, max_state_bytes)
    checker.record_reference()
    n0 = len(checker.reference[0])
    if fractions is None:
        stops = sorted({0, min(1, n0), n0 // 2, max(n0 - 1, 0), n0})
    else:
        stops = sorted({min(n0, round(f * n0)) for f in fractions})
    for k in stops:
        checker.check_break(k, save_again=k == n0 // 2)
    checker.check_continue_and_later()
    return checker.report()


def _fractions(positions: Sequence[float] | None) -> list[float] | None:
    if positions is None:
        return None
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence) or not positions:
        raise ConfigError(f"`positions` must be a non-empty sequence of fractions in [0, 1], got {positions!r}.")
    out = []
    for f in positions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"`positions` must hold fractions in [0, 1], got {f!r}.")
        out.append(float(f))
    return out


class _Checker:
    """The runs of one :func:`check_resume` call and what they found."""

    def __init__(self, make_loader: Callable[[], Any], epochs: int, max_state_bytes: int) -> None:
        if not callable(make_loader):
            raise ConfigError(f"`make_loader` must be a zero-argument callable, got {type(make_loader).__name__}.")
        self.make_loader = make_loader
        self.epochs = epochs
        self.max_state_bytes = max_state_bytes
        self.reference: list[list[Any]] = []
        self.save_points: list[SavePoint] = []
        self.compared = 0
        self.in_order = True  # the loader's in_order: False matches batches within an epoch in any order

    def report(self) -> ResumeReport:
        return ResumeReport(
            epochs=self.epochs,
            batches_per_epoch=tuple(len(r) for r in self.reference),
            save_points=tuple(self.save_points),
            batches_compared=self.compared,
            largest_state_bytes=max((p.state_bytes for p in self.save_points), default=0),
        )

    # -- the runs -----------------------------------------------------------------------------

    def _make(self) -> Any:
        loader = self.make_loader()
        for name in ("state_dict", "load_state_dict"):
            if not callable(getattr(loader, name, None)):
                raise ConfigError(
                    f"`make_loader` must return a naiad.DataLoader, got {type(loader).__name__} (no {name}())."
                )
        return loader

    def record_reference(self) -> None:
        loader = self._make()
        self.in_order = getattr(loader, "in_order", True) is not False
        try:
            for _ in range(self.epochs):
                self.reference.append([snapshot(b) for b in loader])
        finally:
            _close(loader)

    def check_break(self, k: int, *, save_again: bool) -> None:
        """Epoch 0: take the state after ``k`` batches inside the loop, ``break``, resume."""
        loader = self._make()
        try:
            state, seen = self._interrupt(loader, 0, k, "break")
        finally:
            _close(loader)
        self._check_resumed(state, SavePoint(0, k, "break", _size(state)), seen, save_again=save_again)

    def check_continue_and_later(self) -> None:
        """One loader: a state in the middle of epoch 0 without breaking (the loader goes on),
        one after epoch 0 ended, and one in the middle of the last epoch (then ``break``)."""
        loader = self._make()
        points: list[tuple[dict[str, Any], SavePoint, set[int]]] = []
        try:
            mid = len(self.reference[0]) // 2
            state, seen = self._interrupt(loader, 0, mid, "continue")
            points.append((state, SavePoint(0, mid, "continue", _size(state)), seen))
            state = self._take_state(loader, "epoch 0 after it ended (end of epoch)")
            points.append((state, SavePoint(0, len(self.reference[0]), "end of epoch", _size(state)), set()))
            last = self.epochs - 1
            for epoch in range(1, last):
                self._run_epoch(loader, epoch, f"the interrupted run, epoch {epoch}")
            if last > 0:
                mid = len(self.reference[last]) // 2
                state, seen = self._interrupt(loader, last, mid, "later epoch")
                points.append((state, SavePoint(last, mid, "later epoch", _size(state)), seen))
        finally:
            _close(loader)
        for state, point, seen in points:
            self._check_resumed(state, point, seen)

    def _run_epoch(self, loader: Any, epoch: int, context: str) -> None:
        seen: set[int] = set()
        for batch in loader:
            self._compare_batch(batch, epoch, len(seen), context, None, seen)
        self._check_count(len(seen), epoch, 0, context, None)

    def _interrupt(self, loader: Any, epoch: int, k: int, how: str) -> tuple[dict[str, Any], set[int]]:
        """One pass of ``epoch`` (the epoch ``loader`` is at): take the state after ``k``
        batches; then ``break`` (and take it again: it must not move), or, for ``"continue"``,
        go on to the end of the epoch. Also the reference batches received before the state."""
        where = f"epoch {epoch} after {k} batch(es) ({how})"
        context = f"the interrupted run, epoch {epoch} (before the state was taken after {k} batch(es))"
        it = iter(loader)
        state: dict[str, Any] | None = None
        seen: set[int] = set()
        before: set[int] = set()
        while True:
            if len(seen) == k and state is None:
                state = self._take_state(loader, where)
                before = set(seen)
                if how != "continue":
                    break
                context = f"the same loader after its state was taken in {where}"
            try:
                batch = next(it)
            except StopIteration:
                break
            self._compare_batch(batch, epoch, len(seen), context, None, seen)
        del it  # what a `for` loop's `break` does: the pass's iterator is dropped
        received = len(seen)
        if state is None:
            self._check_count(received, epoch, 0, context, None)  # it ended short of k: say so
            raise AssertionError(f"{context}: epoch {epoch} ended after {received} batch(es), before {k}.")
        if how == "continue":
            self._check_count(received, epoch, 0, context, None)
            return state, before
        # Taken again after the break, when the loop has dropped the pass's iterator (as a
        # loop that saves its checkpoint after leaving the loop does): it must not have moved.
        after = self._take_state(loader, f"{where}, taken again after the break")
        if after != state:
            raise AssertionError(
                f"loader state at {where} moved when the loop broke off: taken inside the loop "
                f"{_show(state)}, taken after the break {_show(after)}. A training loop that saves "
                "its checkpoint after leaving the loop would resume elsewhere."
            )
        return state, before

    def _check_resumed(self, state: dict[str, Any], point: SavePoint, seen: set[int], *, save_again: bool = False) -> None:
        """A fresh loader that loads ``state`` yields the reference from ``point`` on (``seen``:
        the reference batches of ``point.epoch`` received before it); with ``save_again``, its
        own state after one more batch resumes exactly too."""
        where = f"resumed from the state taken in {point}"
        first, first_start = point.epoch, point.batches
        if first_start == len(self.reference[first]):
            first, first_start = first + 1, 0  # every batch received: the next epoch is next
        loader = self._make()
        try:
            loader.load_state_dict(json.loads(json.dumps(state)))
            next_epoch = getattr(loader, "epoch", first)
            if next_epoch != first:
                raise AssertionError(
                    f"{where}: the loader's next epoch is {next_epoch}, expected {first}.{_state_note(state)}"
                )
            reported = loader.state_dict()
            if reported != state:
                raise AssertionError(
                    f"{where}: state_dict() right after load_state_dict() is {_show(reported)}, not "
                    f"the state loaded: a checkpoint saved before the first batch would lose the "
                    f"position.{_state_note(state)}"
                )
            again: tuple[dict[str, Any], SavePoint, set[int]] | None = None
            for epoch in range(first, self.epochs):
                start = first_start if epoch == first else 0
                received: set[int] = set(seen) if epoch == first and first == point.epoch else set()
                for batch in loader:
                    self._compare_batch(batch, epoch, len(received), where, state, received)
                    if save_again and again is None:
                        k = len(received)
                        taken = self._take_state(loader, f"epoch {epoch} after {k} batch(es), {where}")
                        again = taken, SavePoint(epoch, k, "resumed, then saved again", _size(taken)), set(received)
                self._check_count(len(received), epoch, start, where, state)
        finally:
            _close(loader)
        self.save_points.append(point)
        if again is not None:
            self._check_resumed(again[0], again[1], again[2])

    # -- checks -------------------------------------------------------------------------------

    def _take_state(self, loader: Any, where: str) -> dict[str, Any]:
        state = loader.state_dict()
        again = loader.state_dict()
        if not isinstance(state, dict):
            raise AssertionError(f"state_dict() at {where} returned a {type(state).__name__}, expected a dict.")
        try:
            text = json.dumps(state, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise AssertionError(f"state_dict() at {where} is not plain JSON ({exc}): {state!r:.500}") from None
        if json.loads(text) != state:
            raise AssertionError(
                f"state_dict() at {where} changes in a JSON round trip (tuples, or keys that are not "
                f"str?): {state!r:.500}"
            )
        if len(text) > self.max_state_bytes:
            raise AssertionError(
                f"state_dict() at {where} is {len(text)} bytes as JSON, more than max_state_bytes="
                f"{self.max_state_bytes}: {text[:300]}..."
            )
        if again != state:
            raise AssertionError(
                f"state_dict() at {where} differs when taken twice in a row: {_show(state)}, then {_show(again)}."
            )
        return state

    def _compare_batch(
        self, got: Any, epoch: int, index: int, context: str, state: dict[str, Any] | None, seen: set[int],
    ) -> None:
        """Check the batch received ``index``-th in ``epoch`` and add its reference batch to
        ``seen``: in order, the reference's batch ``index``; with ``in_order=False``, any of the
        epoch's reference batches not yet in ``seen``."""
        expected = self.reference[epoch]
        if index >= len(expected):
            raise AssertionError(
                f"{context}: epoch {epoch} yielded a batch {index}, but the reference has only "
                f"{len(expected)} batch(es) in that epoch.{_state_note(state)}"
            )
        self.compared += 1
        if not self.in_order:
            self._match_batch(got, epoch, index, context, state, seen)
            return
        diff = first_difference(expected[index], got)
        seen.add(index)
        if diff is None:
            return
        hint = ""
        if state is None:
            hint = " A fresh loader from make_loader() differs from the reference before any resume:"
        elif state.get("epoch") == 0 and state.get("batches_yielded") == 0:
            hint = " Resumed at the very start, it should be a fresh run:"
        if hint:
            hint += " make_loader must build the same loader each time, with an order that repeats (seed=)."
        raise AssertionError(
            f"{context}: epoch {epoch}, batch {index} differs from the reference: {diff}.{hint}{_state_note(state)}"
        )

    def _match_batch(
        self, got: Any, epoch: int, index: int, context: str, state: dict[str, Any] | None, seen: set[int],
    ) -> None:
        expected = self.reference[epoch]
        nearest: tuple[int, str] | None = None
        for j, batch in enumerate(expected):
            if j in seen:
                continue
            diff = first_difference(batch, got)
            if diff is None:
                seen.add(j)
                return
            if nearest is None:
                nearest = j, diff
        again = [j for j in sorted(seen) if first_difference(expected[j], got) is None]
        if again:
            what = f"it is the reference's batch {again[0]}, received already in this epoch (a batch repeated)"
        elif nearest is None:
            what = "every batch of the reference's epoch was received already"
        else:
            what = f"it matches none of the {len(expected) - len(seen)} not yet received (batch {nearest[0]}: {nearest[1]})"
        raise AssertionError(
            f"{context}: epoch {epoch}, the batch received {index}-th (in_order=False: in any order) is not "
            f"one of the reference's: {what}.{_state_note(state)}"
        )

    def _check_count(self, end: int, epoch: int, start: int, context: str, state: dict[str, Any] | None) -> None:
        n = len(self.reference[epoch])
        if end != n:
            raise AssertionError(
                f"{context}: epoch {epoch} yielded {end - start} batch(es), expected {n - start} (the "
                f"reference's batches {start}..{n - 1} of that epoch).{_state_note(state)}"
            )


# ---------------------------------------------------------------------------------------------
# Comparing batches.


def _show(state: Mapping[str, Any] | None) -> str:
    text = json.dumps(state)
    return text if len(text) <= 400 else text[:400] + "..."


def _state_note(state: Mapping[str, Any] | None) -> str:
    return "" if state is None else f" The state: {_show(state)}."


def _size(state: Mapping[str, Any]) -> int:
    return len(json.dumps(state))


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
