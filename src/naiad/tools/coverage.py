"""Check a streaming configuration without reading a row: every row once per epoch on every rank.

:func:`check_coverage` (also ``naiad check SOURCE`` and ``naiad.testing.check_coverage``) counts
the source's rows (metadata for Parquet, Arrow and npy; one scan for newlines for the text
formats), then runs the epochs' plans over row *numbers* instead of rows.

NOTE [ Coverage check ]
A :class:`PositionSource` stands in for the source: the same files, blocks and row counts, one
column ``row`` holding each row's number in file order (0 .. N-1), made with ``numpy.arange``
instead of read. Per rank and epoch the dry run is what the stream's stages do (NOTE [ Stream
stages ]), over that column: the plan's reads in order (``plan_for``, which for a resumed epoch replays the old leg
over positions, NOTE [ Elastic resume ]), through the real :class:`~naiad.stream.shuffle.ShuffleBuffer`
with the rank's seed keys (its draws depend only on chunk sizes, never on the data), cut at the
planned batch sizes; a resume on the same topology goes through ``BufferReplay`` as the loader's
does (NOTE [ Mid-epoch resume ]). So each batch's row numbers are known, vectorized per read,
and the checks are set operations over N integers:

* every rank has the same number of batches, none empty, none larger than ``batch_size``;
* over all ranks, every row exactly once per epoch (with ``drop_last``: at most once, and fewer
  than a batch per rank unused);
* a resume at a fraction of an epoch: the old ranks' batches before it and the new ranks' after
  it deliver every row exactly once again; on the same topology the batches after it are the
  uninterrupted run's, batch for batch.

``num_workers`` does not enter the plan (workers run reads; the pool yields results in plan
order), so it cannot change the order. That is also checked by running the real
:class:`~naiad.stream.batches.BatchStream` over the position column through a
:class:`~naiad.parallel.WorkerPool` of that many thread workers, for the first and last rank
(and after the resume with the new worker count), and comparing its batches with the dry run's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.parallel import WorkerPool
from naiad.sources.base import Source
from naiad.sources.paths import PathLike
from naiad.stream.batches import (
    BatchStream,
    StreamOptions,
    buffer_keys,
    current_leg,
)
from naiad.stream.reads import make_handler_factory
from naiad.stream.replay import BufferReplay
from naiad.stream.restore import window as restore_window
from naiad.stream.shuffle import ShuffleBuffer
from naiad.tools.coverage_report import (
    CoverageReport,
    EpochCoverage,
    ShuffleQuality,
    shuffle_quality_of,
)
from naiad.tools.positions import PositionSource, Topology

__all__ = [
    "CoverageReport", "EpochCoverage", "PositionSource", "ShuffleQuality", "Topology", "check_coverage",
    "planned_batches",
]

DEFAULT_STREAM_ROWS = 200_000
"""Rows per rank of the real position stream compared with the dry run (its first batches)."""

# The problems listed in full; past this many, a count.
_MAX_PROBLEMS = 20


@dataclass
class _Run:
    """One rank's delivery in one leg: the row numbers in order and the batch sizes."""

    rows: np.ndarray
    sizes: np.ndarray

    def first(self, k: int) -> _Run:
        """The first ``k`` batches."""
        return _Run(self.rows[: int(self.sizes[:k].sum())], self.sizes[:k])

    def after(self, k: int) -> _Run:
        """The batches after the first ``k``."""
        return _Run(self.rows[int(self.sizes[:k].sum()) :], self.sizes[k:])

    def batches(self) -> list[np.ndarray]:
        """The batches' row numbers (views)."""
        return np.split(self.rows, np.cumsum(self.sizes)[:-1]) if len(self.sizes) else []


def check_coverage(
    source: Source | PathLike,
    *,
    world_size: int = 1,
    num_workers: int = 0,
    batch_size: int = 1,
    epochs: int = 1,
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    resume_at: float | None = None,
    new_world_size: int | None = None,
    new_num_workers: int | None = None,
    new_batch_size: int | None = None,
    new_shuffle_buffer: int | None = None,
    stream_rows: int = DEFAULT_STREAM_ROWS,
) -> CoverageReport:
    """Prove a streaming configuration's coverage without reading a row (NOTE [ Coverage check ]).

    Args:
        source: a :class:`~naiad.Source`, or a file, glob or list for :func:`naiad.read`.
        world_size, num_workers, batch_size, drop_last, shuffle_buffer: the loader's settings
            (``shuffle_buffer`` None: the loader's default).
        epochs: epochs to check (each has its own order).
        shuffle, seed: as given to ``naiad.DataLoader``.
        resume_at: where training stops and resumes, in epochs: ``1.5`` is the middle of epoch 1
            (the batches every rank delivered, rounded down). The ``new_*`` settings (None: the
            same as before) apply from there on; a different world size, batch size or buffer
            is an elastic resume.
        stream_rows: rows per checked rank of the real position stream (0: skip that run).

    Returns:
        A :class:`CoverageReport`; ``report.ok`` is False when a check failed, and
        ``report.problems`` says which and where.

    Raises:
        ConfigError: a bad argument. SourceError: the files cannot be counted.

    Example:
        >>> report = check_coverage("train-*.parquet", world_size=8, batch_size=256)  # doctest: +SKIP
        >>> report.ok, report.total_rows, report.batches_per_rank  # doctest: +SKIP
        (True, 1000000, 489)
    """
    started = time.perf_counter()
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"`epochs` must be an int >= 1, got {epochs!r}.")
    if resume_at is not None and not 0 <= resume_at < epochs:
        raise ConfigError(f"`resume_at` must be in [0, epochs={epochs}), in epochs, got {resume_at!r}.")
    if not isinstance(source, Source):
        from naiad.sources.auto import read

        source = read(source)
    before = Topology(world_size, num_workers, batch_size, drop_last, shuffle_buffer)
    after = Topology(
        before.world_size if new_world_size is None else new_world_size,
        before.num_workers if new_num_workers is None else new_num_workers,
        before.batch_size if new_batch_size is None else new_batch_size,
        drop_last, before.shuffle_buffer if new_shuffle_buffer is None else new_shuffle_buffer,
    )
    pos = PositionSource(source)
    if shuffle:  # a default buffer is what the loader would take
        before, after = pos.with_loader_buffer(before), pos.with_loader_buffer(after)
    check = _Check(pos, seed=int(seed), shuffle=bool(shuffle), stream_rows=stream_rows)
    runs0 = check.epoch_runs(before, 0)
    report = CoverageReport(
        source=repr(source), total_rows=pos.total_rows, files=len(pos.paths), blocks=len(pos.blocks()),
        settings={
            "world_size": world_size, "num_workers": num_workers, "batch_size": batch_size, "epochs": epochs,
            "shuffle": bool(shuffle), "seed": int(seed), "drop_last": drop_last,
            "shuffle_buffer_rows": before.options(0, seed=0, shuffle=True).buffer_rows,
            "resume_at": resume_at, "new_world_size": after.world_size, "new_num_workers": after.num_workers,
            "new_batch_size": after.batch_size,
            "new_shuffle_buffer_rows": after.options(0, seed=0, shuffle=True).buffer_rows,
        },
        batches_per_rank=len(runs0[0].sizes),
    )
    if sum(len(r.rows) for r in runs0) >= 3:
        report.quality = shuffle_quality_of([(r.rows, r.sizes) for r in runs0], pos.total_rows)
    if stream_rows:
        check.compare_stream(before, 0, runs0)
    resume_epoch = None if resume_at is None else int(resume_at)
    for epoch in range(epochs):
        if resume_epoch is None or epoch < resume_epoch:
            runs = runs0 if epoch == 0 else check.epoch_runs(before, epoch)
            report.epochs.append(check.epoch(epoch, [("", before, runs)]))
        elif epoch > resume_epoch:
            report.epochs.append(check.epoch(epoch, [("", after, check.epoch_runs(after, epoch))]))
        else:
            assert resume_at is not None
            report.epochs.append(check.resumed_epoch(epoch, resume_at - epoch, before, after,
                                                     runs0 if epoch == 0 else None))
    report.problems = check.problems if len(check.problems) <= _MAX_PROBLEMS else [
        *check.problems[:_MAX_PROBLEMS], f"... and {len(check.problems) - _MAX_PROBLEMS} more problem(s)"]
    report.stream_checks = check.stream_checks
    report.seconds = time.perf_counter() - started
    return report


def planned_batches(
    source: Source | PositionSource,
    topology: Topology,
    rank: int,
    *,
    epoch: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    resumed: tuple[Topology, int] | None = None,
) -> list[np.ndarray]:
    """The row numbers (file order, from 0) of each batch rank ``rank`` yields in ``epoch``,
    from the dry run (NOTE [ Coverage check ]): what ``naiad.DataLoader(source, rank=rank, ...)``
    delivers, without reading a row.

    Args:
        resumed: ``(old topology, k)``: the batches after a resume from the state every rank of
            the old topology had after ``k`` batches of ``epoch`` (elastic when the topologies differ).

    Example:
        >>> planned_batches(naiad.read("a.csv"), Topology(2, batch_size=4), 1)[0]  # doctest: +SKIP
        array([17,  3, 11,  9])
    """
    pos = source if isinstance(source, PositionSource) else PositionSource(source)
    if shuffle:  # a default buffer is what the loader of the source would take
        topology = pos.with_loader_buffer(topology)
        resumed = None if resumed is None else (pos.with_loader_buffer(resumed[0]), resumed[1])
    check = _Check(pos, seed=seed, shuffle=shuffle, stream_rows=0)
    state = None if resumed is None else check.state_after(resumed[0], epoch, resumed[1])
    return check.dry_run(check.options(topology, rank), epoch, state).batches()


class _Check:
    """The dry runs and the checks over them, collecting problems in words."""

    def __init__(self, pos: PositionSource, *, seed: int, shuffle: bool, stream_rows: int) -> None:
        self.pos = pos
        self.seed = seed
        self.shuffle = shuffle
        self.stream_rows = stream_rows
        self.problems: list[str] = []
        self.stream_checks: list[str] = []

    def options(self, topo: Topology, rank: int) -> StreamOptions:
        return topo.options(rank, seed=self.seed, shuffle=self.shuffle)

    def epoch_runs(self, topo: Topology, epoch: int, state: dict[str, Any] | None = None) -> list[_Run]:
        """Every rank's delivery in ``epoch`` (after ``state``'s position when given)."""
        return [self.dry_run(self.options(topo, r), epoch, state) for r in range(topo.world_size)]

    def dry_run(self, options: StreamOptions, epoch: int, state: dict[str, Any] | None = None) -> _Run:
        """What the stream's stages yield on one rank, over row numbers (NOTE [ Coverage check ])."""
        stream = BatchStream(self.pos, options, epoch=epoch, imap=_no_reads, state=state)
        if stream.ended is not None:  # resumed after its last batch: nothing more this epoch
            return _Run(np.zeros(0, np.int64), np.zeros(0, np.int64))
        plan, k = stream.plan, stream.batches_yielded
        sizes = plan.batch_sizes[k:]
        o = options
        buffer = ShuffleBuffer(o.buffer_rows, buffer_keys(o.seed, epoch, stream.rank, len(stream.legs))) if o.shuffle else None
        start = int(plan.batch_sizes[:k].sum())
        restore = BufferReplay.replay(plan, buffer, start) if start else BufferReplay.nothing()
        tasks = list(plan.tasks[restore.next_task :])
        if restore.remainder is not None:
            tasks.insert(0, restore.remainder)
        # The owed rows go to the batches, the held ones back to the buffer (NOTE [ Owed rows first ]).
        chunks = [self.rows_at(restore, restore.owed)]
        restore.install(buffer, {"row": self.rows_at(restore, restore.held)})
        need, have = int(sizes.sum()), len(chunks[0])
        for task in tasks:
            if have >= need:
                break  # drop_last: the stream stops at its last batch
            rows = self.pos.rows_of(task)
            out = [c["row"] for c in buffer.push({"row": rows})] if buffer is not None else [rows]
            chunks.extend(out)
            have += sum(len(c) for c in out)
        else:
            if buffer is not None:
                chunks.append(buffer.flush().get("row", np.zeros(0, np.int64)))
        return _Run(np.concatenate(chunks)[:need], sizes)

    def rows_at(self, restore: BufferReplay, positions: np.ndarray) -> np.ndarray:
        """The row numbers at some of a resume's stream ``positions``, read as the stream reads them."""
        window = restore_window(restore, positions)
        if not window.reads:
            return np.zeros(0, np.int64)
        return window.place({"row": np.concatenate([self.pos.rows_of(t) for t in window.reads])})["row"]

    def epoch(self, epoch: int, legs: Sequence[tuple[str, Topology, list[_Run]]],
              resumed_after: int | None = None) -> EpochCoverage:
        """Check one epoch made of legs (label, topology, each rank's run): steps and coverage."""
        for label, topo, runs in legs:
            self.check_batches(epoch, label, topo, runs, whole=resumed_after is None)
        rows = np.concatenate([r.rows for _, _, leg in legs for r in leg]) if legs else np.zeros(0, np.int64)
        n = self.pos.total_rows
        where = f"epoch {epoch}"
        outside = rows[(rows < 0) | (rows >= n)]
        if len(outside):
            self.problems.append(f"{where}: {len(outside)} row number(s) outside 0..{n - 1}, e.g. {int(outside[0])}.")
            rows = rows[(rows >= 0) & (rows < n)]
        counts = np.bincount(rows, minlength=n)
        twice = np.flatnonzero(counts > 1)
        if len(twice):
            self.problems.append(f"{where}: {len(twice):,} row(s) delivered more than once, first "
                                 f"{self.pos.where(int(twice[0]))}, {int(counts[twice[0]])} times.")
        missing = np.flatnonzero(counts == 0)
        last = legs[-1][1]
        allowed = last.world_size * last.batch_size if last.drop_last else 0
        if len(missing) > allowed:
            why = "" if not last.drop_last else f" (drop_last leaves fewer than {allowed:,})"
            self.problems.append(f"{where}: {len(missing):,} row(s) never delivered{why}, first "
                                 f"{self.pos.where(int(missing[0]))}.")
        batches = sum(len(runs[0].sizes) for _, _, runs in legs)
        return EpochCoverage(epoch, batches, int(len(rows)), int(len(missing)), resumed_after)

    def check_batches(self, epoch: int, label: str, topo: Topology, runs: list[_Run], *, whole: bool) -> None:
        """Equal steps on every rank, no empty batch, none too large, the rows to fill them; and for
        a ``whole`` epoch (not the legs of a resumed one), at least one batch."""
        where = f"epoch {epoch}{label}"
        steps = [len(r.sizes) for r in runs]
        if len(set(steps)) > 1:
            r = int(np.argmin(steps))
            self.problems.append(f"{where}: ranks yield different numbers of batches: rank {r} {steps[r]}, "
                                 f"rank {int(np.argmax(steps))} {max(steps)}; collectives would wait for ever.")
        if whole and steps and max(steps) == 0 and self.pos.total_rows:
            why = f"with drop_last, each rank's {self.pos.total_rows // topo.world_size:,} rows are fewer than " \
                  f"batch_size={topo.batch_size}" if topo.drop_last else "no rows"
            self.problems.append(f"{where}: no batches on any rank ({why}).")
        for rank, run in enumerate(runs):
            empty = np.flatnonzero(run.sizes == 0)
            if len(empty):
                self.problems.append(
                    f"{where}: rank {rank} yields {len(empty)} empty batch(es), first batch {int(empty[0])}: "
                    f"{self.pos.total_rows:,} rows over {topo.world_size} ranks leave fewer rows than batches.")
                break
            big = np.flatnonzero(run.sizes > topo.batch_size)
            if len(big) or (topo.drop_last and np.any(run.sizes != topo.batch_size)):
                self.problems.append(f"{where}: rank {rank}'s batch sizes break batch_size={topo.batch_size}"
                                     f"{' with drop_last' if topo.drop_last else ''}: {run.sizes[:8].tolist()}...")
                break
            if len(run.rows) != int(run.sizes.sum()):
                self.problems.append(f"{where}: rank {rank}'s stream yields {len(run.rows):,} rows, its batches "
                                     f"need {int(run.sizes.sum()):,}.")
                break

    def resumed_epoch(self, epoch: int, fraction: float, before: Topology, after: Topology,
                      old: list[_Run] | None) -> EpochCoverage:
        """Stop after ``fraction`` of ``epoch``'s batches, resume on ``after``, check the whole epoch."""
        old = old if old is not None else self.epoch_runs(before, epoch)
        k = int(fraction * len(old[0].sizes))
        state = self.state_after(before, epoch, k)
        new = self.epoch_runs(after, epoch, state)
        if current_leg(self.options(before, 0)).same_topology(current_leg(self.options(after, 0))):
            for rank, (o, n) in enumerate(zip(old, new)):
                rest = o.after(k)
                if not (np.array_equal(rest.sizes, n.sizes) and np.array_equal(rest.rows, n.rows)):
                    self.problems.append(f"epoch {epoch}: rank {rank}'s batches after the resume at batch {k} are not "
                                         "the uninterrupted run's.")
        if self.stream_rows:
            self.compare_stream(after, epoch, new, state)
        legs = [(" before the resume", before, [r.first(k) for r in old]), (" after the resume", after, new)]
        return self.epoch(epoch, legs, resumed_after=k)

    def _compare_one(self, stream: BatchStream, expected: list[np.ndarray], epoch: int, rank: int,
                     workers: int) -> int:
        """Compare ``stream``'s batches with ``expected`` up to ``stream_rows`` rows; returns the
        batches compared."""
        where = f"epoch {epoch}: rank {rank}'s real stream over row numbers (num_workers={workers})"
        rows = compared = 0
        for b, batch in enumerate(stream):
            got = batch["row"].numpy()
            if b >= len(expected):
                self.problems.append(f"{where} yields more batches than the plan's {len(expected)}.")
                return compared
            if not np.array_equal(got, expected[b]):
                self.problems.append(f"{where} differs from the dry run at batch {b}: "
                                     f"{got[:6].tolist()} against {expected[b][:6].tolist()}.")
                return compared
            rows += len(got)
            compared += 1
            if rows >= self.stream_rows:
                return compared
        if compared < len(expected):
            self.problems.append(f"{where} ends after {compared} batches, the plan has {len(expected)}.")
        return compared

    def state_after(self, topo: Topology, epoch: int, k: int) -> dict[str, Any]:
        """The stream state every rank of ``topo`` has after ``k`` batches of ``epoch`` (rank 0's:
        a state does not depend on the rank it was taken on)."""
        return BatchStream(self.pos, self.options(topo, 0), epoch=epoch, imap=_no_reads).get_state(batches_yielded=k)

    def compare_stream(self, topo: Topology, epoch: int, runs: list[_Run], state: dict[str, Any] | None = None) -> None:
        """Run the real stream over row numbers with ``topo.num_workers`` thread workers on the first
        and last rank; its batches must be the dry run's."""
        ranks = sorted({0, topo.world_size - 1})
        compared, problems = 0, len(self.problems)
        pool = WorkerPool(make_handler_factory(self.pos), num_workers=topo.num_workers, mode="thread")
        try:
            for rank in ranks:
                expected = runs[rank].batches()
                stream = BatchStream(self.pos, self.options(topo, rank), epoch=epoch,
                                     imap=functools.partial(pool.imap, prefetch=2, in_order=True), state=state)
                try:
                    compared += self._compare_one(stream, expected, epoch, rank, topo.num_workers)
                finally:
                    stream.close()
        finally:
            pool.close()
        after = "" if state is None else f" after the resume at batch {state['batches']['yielded']}"
        verdict = "matched" if len(self.problems) == problems else "did NOT match"
        self.stream_checks.append(
            f"epoch {epoch}{after}: the real stream over row numbers with num_workers={topo.num_workers} (threads) "
            f"{verdict} the dry run on rank(s) {', '.join(map(str, ranks))}: {compared:,} batches compared")


def _no_reads(tasks: Any) -> Iterator[Any]:
    raise RuntimeError("a dry run reads nothing")
