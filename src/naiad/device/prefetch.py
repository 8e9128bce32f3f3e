"""Device prefetching: batches reach the device while the previous step still runs.

:class:`DevicePrefetcher` wraps any iterable of batches (a naiad or torch DataLoader, a
generator). A background thread takes the next batches from it, pins their host memory and
starts their copies to the device on a dedicated CUDA stream, at most ``depth`` batches ahead of
the training loop; the training loop gets batches that are already on the device, or on their
way there, with the stream ordering that makes using them safe (see the note below).
``device="cpu"`` keeps only the background prefetch, which overlaps loading with a step that
releases the GIL (a GPU step, a sleep, most torch and NumPy kernels).

NOTE [ Stream synchronization of prefetched batches ]
A copy issued on a side stream runs concurrently with the training stream; nothing orders the
two unless we say so. The protocol, per batch:

1. Producer thread (:class:`naiad.device.transfer.CudaMover`), with the copy stream current: pin
   each CPU tensor (``pin_memory()``; a ``non_blocking`` copy from pageable memory would be
   synchronous), then
   ``tensor.to(device, non_blocking=True)``. The device memory is allocated by the caching
   allocator *on the copy stream*. The pinned source may be dropped right away: torch records an
   event for a non-blocking copy from pinned memory, and the pinned-memory cache reuses the
   block only once that copy is done.
2. Producer: record a ``torch.cuda.Event`` on the copy stream after the last copy, and queue
   ``(batch, event)``. The producer never waits for the copy: the GPU does.
3. Consumer, in ``__next__``, on the stream that is *current for the consumer at that moment*
   (the default stream, or the user's own ``torch.cuda.stream(...)``):
   ``current_stream.wait_event(event)``, so every kernel the training step queues after this
   point runs after the copy has landed. Without this wait (as in the hand-written loaders this
   replaces) the step may read the batch's memory before the copy has written it, and gets
   garbage with no error.
4. Consumer: ``tensor.record_stream(current_stream)`` for every tensor the producer copied. The
   caching allocator ties a block to the stream it was allocated on (the copy stream); when the
   training loop drops the batch, the allocator would hand the block to the next copy on the
   copy stream at once, while kernels queued on the training stream may still be reading it.
   ``record_stream`` makes the free wait for the training stream's work queued so far.

Tensors already on the target device pass through untouched (no copy, no event needed); tensors
on another device are moved in step 3 by the consumer, on its own stream, so ordering is
ordinary stream order. The ``depth`` bound (a semaphore of slots, released when a batch is handed
over) limits device memory to ``depth`` batches in flight plus the one the step is using.

NOTE [ Prefetcher shutdown ]
The background thread holds only the source iterator and a :class:`_Channel` (queue, slots, stop
flag), never the consumer-side iterator, so dropping the iterator (``break`` out of a ``for``
loop, an exception, garbage collection) runs its ``weakref.finalize``: set ``stop``, release a
slot to wake a producer waiting for one, join with a timeout, drop the batches still queued.
Every blocking wait on either side polls (``_POLL_S``), so a stop is seen within one poll; a
producer stuck inside the source's ``next()`` finishes that call first, then exits, and closes
the source iterator (stopping its workers) in its own ``finally``.
"""

from __future__ import annotations

import queue
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

import torch

from naiad.device.transfer import CudaMover, GenericMover, Mover
from naiad.device.tree import count_rows, map_tensors
from naiad.errors import ConfigError, WorkerError, add_note
from naiad.telemetry import Telemetry

__all__ = ["DevicePrefetcher", "PrefetchIterator"]

T = TypeVar("T")

# How often a blocked wait wakes up to look at the other side (stop flag, thread alive).
_POLL_S = 0.05
_JOIN_TIMEOUT_S = 10.0

# Kinds of items on the channel.
_BATCH, _END, _ERROR = 0, 1, 2


# --------------------------------------------------------------------------------------------
# The producer thread.


class _Channel:
    """What the producer thread and the consumer share. The thread never holds the iterator."""

    __slots__ = ("items", "slots", "stop", "join_timeout_s")

    def __init__(self, depth: int) -> None:
        self.items: queue.SimpleQueue[tuple[int, Any, Any, Any]] = queue.SimpleQueue()
        self.slots = threading.Semaphore(depth)
        self.stop = threading.Event()
        # How long shutdown waits for the thread; 0 after a timeout, when it is known stuck.
        self.join_timeout_s = _JOIN_TIMEOUT_S


class _Progress:
    """Where the producer is, for the note on an exception: which batch, doing what."""

    __slots__ = ("index", "doing")

    def __init__(self) -> None:
        self.index = 0
        self.doing = "fetching"


class _Producer:
    """The producer thread's work: fetch a batch, move it, hand it over, while slots are free."""

    __slots__ = ("source", "chan", "mover", "telemetry", "source_stage", "rows_of", "device", "progress")

    def __init__(self, source: Iterator[Any], chan: _Channel, mover: Mover, telemetry: Telemetry | None,
                 source_stage: str | None, rows_of: Callable[[Any], int | None], device: torch.device) -> None:
        self.source: Iterator[Any] | None = source
        self.chan, self.mover, self.telemetry, self.device = chan, mover, telemetry, device
        self.source_stage, self.rows_of = source_stage, rows_of
        self.progress = _Progress()

    def run(self) -> None:
        """The thread's body: every batch, then the end or the error, handed to the consumer."""
        chan, progress = self.chan, self.progress
        try:
            while _slot_free(chan) and self.one():
                progress.index += 1
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the consumer
            add_note(
                exc,
                f"naiad: raised in the DevicePrefetcher's background thread while {progress.doing} batch "
                f"{progress.index} (0-based) of its source.",
            )
            chan.items.put((_ERROR, exc, None, None))
        finally:
            # Close the source here, in the thread that ran it: a generator's finally blocks run
            # and a DataLoader iterator dropped here stops its workers.
            source, self.source = self.source, None
            if isinstance(source, types.GeneratorType):
                try:
                    source.close()
                except Exception:  # noqa: BLE001 - the consumer already has its answer
                    pass
            del source

    def one(self) -> bool:
        """Fetch one batch, move it and hand it over; False at the end of the source or a stop."""
        chan, progress, telemetry = self.chan, self.progress, self.telemetry
        progress.doing = "fetching"
        t0 = time.perf_counter()
        try:
            batch = next(self.source)  # type: ignore[arg-type]  # None only after run() ends
        except StopIteration:
            chan.items.put((_END, None, None, None))
            return False
        if chan.stop.is_set():
            return False
        progress.doing = f"moving to {self.device}"
        t1 = time.perf_counter()
        moved, event, copied, foreign = self.mover(batch)
        rows = self.rows_of(batch) or 0
        if telemetry is not None:
            if self.source_stage is not None:
                telemetry.add(self.source_stage, t1 - t0, start_s=t0)
            telemetry.end("transfer", t1)
        chan.items.put((_BATCH, moved, event, (copied, foreign, rows)))
        # Return holding no batch: the consumer owns it now, and device memory stays bounded by
        # `depth` batches plus the one in use while the producer waits for the next slot.
        return True


def _slot_free(chan: _Channel) -> bool:
    """Wait for a free slot (polling, so a stop is seen); False when stopped."""
    while not chan.slots.acquire(timeout=_POLL_S):
        if chan.stop.is_set():
            return False
    return not chan.stop.is_set()


def _shutdown(chan: _Channel, thread: threading.Thread) -> None:
    chan.stop.set()
    chan.slots.release()  # wake a producer waiting for a free slot
    if thread is not threading.current_thread() and thread.ident is not None:
        join_timeout_s = chan.join_timeout_s
        thread.join(timeout=join_timeout_s)
        if thread.is_alive() and join_timeout_s > 0:
            warnings.warn(
                f"naiad: the DevicePrefetcher's background thread is still inside its source's "
                f"next() after {join_timeout_s} s; it exits when that call returns.",
                RuntimeWarning,
                stacklevel=2,
            )
    while True:  # drop the queued batches now: they hold device memory
        try:
            chan.items.get_nowait()
        except queue.Empty:
            break


# --------------------------------------------------------------------------------------------
# Public classes.


class PrefetchIterator(Iterator[T]):
    """One pass over a :class:`DevicePrefetcher`'s source; made by ``iter(prefetcher)``.

    Closes itself at the end of the source, on an error, on :meth:`close`, when used as a
    context manager, and when garbage-collected (a ``break`` out of a ``for`` loop).

    Attributes:
        delivered: batches handed to the caller so far. A checkpoint should count these, not
            the source's position, which runs up to ``depth`` batches ahead.
    """

    def __init__(
        self,
        source: Iterator[Any],
        *,
        device: torch.device,
        depth: int,
        mover: Mover,
        telemetry: Telemetry | None,
        record_steps: bool,
        source_stage: str | None,
        rows_of: Callable[[Any], int | None],
        timeout_s: float | None,
        sized: Any = None,
        start_at_first_next: bool = False,
    ) -> None:
        self.delivered = 0
        # Called with the new count after each batch handed over: lets a loader keep the count
        # after this iterator is gone (a `break`), for its state_dict().
        self.on_delivered: Callable[[int], None] | None = None
        self._sized = sized  # what len() asks, on demand: some sources count by scanning
        self._device = device
        self._telemetry = telemetry if record_steps else None
        self._timeout_s = timeout_s
        self._chan = _Channel(depth)
        self._done = False
        self._thread = threading.Thread(
            target=_Producer(source, self._chan, mover, telemetry, source_stage, rows_of, device).run,
            name="naiad-prefetch",
            daemon=True,  # never blocks interpreter exit; the finalizer stops it before that
        )
        self._finalizer = weakref.finalize(self, _shutdown, self._chan, self._thread)
        self._started = False
        if not start_at_first_next:
            self._start()

    def _start(self) -> None:
        self._started = True
        self._thread.start()

    def __iter__(self) -> PrefetchIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if not self._started:
            self._start()
        t0 = time.perf_counter()
        value: T  # the batch; an _ERROR item's is the exception instead
        kind, value, event, extra = self._get()
        if kind == _END:
            self.close()
            raise StopIteration
        if kind == _ERROR:
            self.close()
            raise cast(BaseException, value)
        self._chan.slots.release()
        copied, foreign, rows = extra
        if event is not None:
            # NOTE [ Stream synchronization of prefetched batches ], steps 3 and 4.
            stream = torch.cuda.current_stream(self._device)
            stream.wait_event(event)
            for t in copied:
                t.record_stream(stream)
        if foreign:
            value = map_tensors(
                lambda t: t if t.device == self._device else t.to(self._device), value
            )
        self.delivered += 1
        if self.on_delivered is not None:
            self.on_delivered(self.delivered)
        if self._telemetry is not None:
            self._telemetry.record_step(time.perf_counter() - t0, rows)
        return value

    def __len__(self) -> int:
        # As torch's DataLoader iterators do: the length of the whole pass, not what is left.
        try:
            return len(self._sized)
        except TypeError:
            raise TypeError("this PrefetchIterator has no len(): its source has none.") from None

    def _get(self) -> tuple[int, Any, Any, Any]:
        chan = self._chan
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        while True:
            wait_s = (
                _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            )
            try:
                return chan.items.get(timeout=wait_s)
            except queue.Empty:
                pass
            if not self._thread.is_alive():
                try:  # it may have queued its last item just before it exited
                    return chan.items.get_nowait()
                except queue.Empty:
                    self.close()
                    raise WorkerError(
                        "the DevicePrefetcher's background thread stopped without a batch, an end "
                        f"or an error, after {self.delivered} batches.",
                        worker_id=0,
                        task=f"prefetching batch {self.delivered}",
                    ) from None
            if deadline is not None and time.monotonic() >= deadline:
                # The thread is stuck in the source's next(): ask it to stop, don't wait for it.
                chan.join_timeout_s = 0.0
                self.close()
                raise WorkerError(
                    f"no batch from the DevicePrefetcher's source within timeout_s={self._timeout_s} "
                    f"while waiting for batch {self.delivered}; raise `timeout_s` or find what "
                    "blocks the source.",
                    worker_id=0,
                    task=f"prefetching batch {self.delivered}",
                )

    @property
    def alive(self) -> bool:
        """Whether the background thread is still running."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the background thread and drop the batches it prefetched. Safe to call twice."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> PrefetchIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DevicePrefetcher(Generic[T]):
    """Wraps an iterable of batches; yields them on ``device``, prefetched in the background.

    Each ``iter()`` starts one pass over ``iterable`` with its own background thread (see
    :class:`PrefetchIterator`). Batches may be tensors or dicts, lists, tuples and namedtuples
    of them, nested; other leaves (strings, numbers, NumPy arrays) pass through unchanged. On
    CUDA, host memory is pinned and copied on a dedicated stream, and the consumer's current
    stream waits for the copy before the batch is handed over (NOTE [ Stream synchronization of
    prefetched batches ]). An exception raised by the source is re-raised by ``next()`` with its
    own traceback and a note saying which batch.

    Args:
        iterable: the batches: a DataLoader, a generator, a list.
        device: where batches go: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` (background prefetch only).
        depth: batches prepared ahead of the training loop (>= 1).
        pin_memory: pin CPU tensors before copying; default: True for CUDA. Only for CUDA.
        telemetry: records ``transfer`` (pinning and issuing the copies, in the thread) and each
            ``next()`` as a step (the wait and the rows); see :mod:`naiad.telemetry`.
        record_steps: False leaves step recording to the caller (the telemetry still gets
            ``transfer``).
        source_stage: given, the time the thread spends in the source's ``next()`` is recorded
            as this stage (for example ``"load"`` around a torch DataLoader).
        rows_of: counts the rows of a batch for telemetry; default: length of the first tensor.
        timeout_s: longest wait for one batch before :class:`~naiad.errors.WorkerError`; None
            waits as long as the background thread lives.
        start_at_first_next: leave the source untouched until the first ``next()`` (default:
            start prefetching at ``iter()``). naiad's loader asks for it, so that a pass still
            takes an epoch set after ``iter()``.

    Example:
        >>> batches = [{"x": torch.full((2,), float(i)), "id": i} for i in range(3)]
        >>> [b["id"] for b in DevicePrefetcher(batches, "cpu")]
        [0, 1, 2]
        >>> len(DevicePrefetcher(batches, "cpu", depth=1))
        3
    """

    def __init__(
        self,
        iterable: Iterable[T],
        device: str | torch.device,
        depth: int = 2,
        *,
        pin_memory: bool | None = None,
        telemetry: Telemetry | None = None,
        record_steps: bool = True,
        source_stage: str | None = None,
        rows_of: Callable[[Any], int | None] | None = None,
        timeout_s: float | None = None,
        start_at_first_next: bool = False,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"`depth` must be an int >= 1, got {depth!r}.")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigError(f"`timeout_s` must be > 0 or None, got {timeout_s!r}.")
        if not isinstance(iterable, Iterable):
            raise ConfigError(
                f"`iterable` must be iterable (a DataLoader, a generator, a list), got {type(iterable).__name__}."
            )
        self._device = _resolve_device(device)
        if pin_memory and self._device.type != "cuda":
            raise ConfigError(
                f"`pin_memory=True` needs a CUDA `device`, got device={str(self._device)!r}; "
                "leave `pin_memory` unset."
            )
        self._pin_memory = self._device.type == "cuda" if pin_memory is None else bool(pin_memory)
        self._source = iterable
        self._depth = depth
        self._telemetry = telemetry
        self._record_steps = record_steps
        self._source_stage = source_stage
        self._rows_of = rows_of or count_rows
        self._timeout_s = timeout_s
        self._start_at_first_next = start_at_first_next

    @property
    def source(self) -> Iterable[T]:
        """The wrapped iterable."""
        return self._source

    @property
    def device(self) -> torch.device:
        """The target device (a CUDA device always has its index)."""
        return self._device

    @property
    def depth(self) -> int:
        """Batches prepared ahead of the training loop."""
        return self._depth

    def __iter__(self) -> PrefetchIterator[T]:
        if self._device.type == "cuda":
            mover: Mover = CudaMover(self._device, self._pin_memory)
        elif self._device.type == "cpu":
            mover = Mover(self._device)
        else:
            mover = GenericMover(self._device)
        # iter() here, in the caller's thread: a DataLoader starts its worker processes in it.
        return PrefetchIterator(
            iter(self._source),
            device=self._device,
            depth=self._depth,
            mover=mover,
            telemetry=self._telemetry,
            record_steps=self._record_steps,
            source_stage=self._source_stage,
            rows_of=self._rows_of,
            timeout_s=self._timeout_s,
            sized=self._source,
            start_at_first_next=self._start_at_first_next,
        )

    def __len__(self) -> int:
        try:
            return len(self._source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"DevicePrefetcher has no len(): its source ({type(self._source).__name__}) has none."
            ) from None

    def __repr__(self) -> str:
        return (
            f"DevicePrefetcher({type(self._source).__name__}, device={str(self._device)!r}, "
            f"depth={self._depth})"
        )


def _resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"`device` must name a torch device such as 'cuda' or 'cpu', got {device!r}."
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"`device` is {device!r} but CUDA is not available (torch {torch.__version__}, "
                "torch.cuda.is_available() is False); use device='cpu' or a CUDA build of torch."
            )
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"`device` is {device!r} but there are {torch.cuda.device_count()} CUDA devices."
            )
        dev = torch.device("cuda", index)
    return dev
