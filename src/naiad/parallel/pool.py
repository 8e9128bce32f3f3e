"""WorkerPool: run a handler over a stream of tasks in processes or threads, results in order.

NOTE [ Worker protocol ]
Each worker owns a task channel (main -> worker) and the main process owns one result channel
per worker (worker -> main). Tasks are ``(seq, payload)``; ``seq`` numbers are unique for the
pool's lifetime, so a result that belongs to an abandoned epoch (a ``break``) is recognised and
dropped. A worker answers every task with exactly one message:

    ("ok", seq, result, stage_seconds)    the handler returned
    ("exhausted", seq, None, {})          the handler raised Exhausted (an iterable ran out)
    ("error", seq, RemoteError, {})       the handler raised; re-raised in the consumer

plus one ("ready", -1, None, {}) or ("error", -1, RemoteError, {}) after building its handler.
The main process waits on the result channels *and* the process sentinels together
(``multiprocessing.connection.wait``), so a worker that dies is seen at once, not after a
timeout; its buffered results are drained first, then a WorkerError names the worker, its exit
code and the task it held. Tasks go through ``multiprocessing.Queue`` (a feeder thread), so the
main process never blocks on a full pipe while a worker blocks on sending its result.

Teardown escalates: a ``None`` task asks each worker to return, then join with a timeout, then
terminate, then kill. Workers ignore SIGINT (Ctrl-C reaches the main process, which tears them
down) and return when their parent is gone, so no worker outlives the training process.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from naiad.errors import ConfigError, WorkerError

__all__ = [
    "Exhausted",
    "HandlerFactory",
    "Pinned",
    "WorkerContext",
    "WorkerPool",
    "get_worker_context",
]

# How often a blocked wait wakes up to check that the other side is alive.
_POLL_S = 0.5
# Grace for a worker to finish its task and return before it is terminated: a worker busy on
# a task nobody will read (after a `break` or an error) need not be waited for.
_JOIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class WorkerContext:
    """What a handler factory knows about the worker it runs in.

    Attributes:
        worker_id: 0 .. num_workers - 1 (0 when running inline).
        num_workers: the pool's worker count (0 when running inline).
        seed: this worker's seed, derived from the pool's base seed and the worker id.
        mode: "process", "thread" or "inline".
    """

    worker_id: int
    num_workers: int
    seed: int
    mode: str = "inline"

    def rng(self, *keys: int) -> np.random.Generator:
        """A NumPy generator for this worker and ``keys`` (e.g. the epoch), never from the clock."""
        return np.random.default_rng(np.random.SeedSequence([self.seed, self.worker_id, *keys]))


HandlerFactory = Callable[[WorkerContext], Callable[[Any], Any]]
"""Builds, inside a worker, the callable that turns one task payload into one result."""


class Exhausted(Exception):
    """Raised by a handler to say this worker has nothing more to give (an iterable ran out)."""


@dataclass(frozen=True)
class Pinned:
    """A task that must run on one given worker (its payload is passed to the handler)."""

    worker_id: int
    payload: Any


_local = threading.local()


def get_worker_context() -> WorkerContext | None:
    """The :class:`WorkerContext` of the calling worker, or None outside naiad's workers."""
    return getattr(_local, "context", None)


class RemoteError:
    """An exception raised in a worker, carried to the consumer with its type, message and traceback."""

    def __init__(self, exc: BaseException) -> None:
        self.tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            # Most exceptions pickle; keeping the object keeps its type, args and attributes.
            self.payload: bytes | None = pickle.dumps(exc)
        except Exception:
            self.payload = None
        self.type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.message = str(exc)

    def rebuild(self) -> BaseException:
        """The exception to raise in the consumer (the same type whenever it can be rebuilt)."""
        exc: BaseException | None = None
        if self.payload is not None:
            try:
                exc = pickle.loads(self.payload)  # our own worker's bytes, never user input
            except Exception:
                exc = None
        if exc is None:
            exc = RuntimeError(f"{self.type_name}: {self.message}")
        add_note(exc, "Traceback in the worker:\n" + self.tb.rstrip())
        return exc


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where the note is stored but not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(exc, "__notes__", None) or []
        notes.append(note)
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# Transport: NumPy arrays cross the process boundary through torch's shared memory.


class _SharedArray:
    """A NumPy array carried as a tensor, so torch moves it through shared memory, not a pipe."""

    __slots__ = ("tensor",)

    def __init__(self, array: np.ndarray) -> None:
        import torch

        self.tensor = torch.from_numpy(np.ascontiguousarray(array))


def _pack(obj: Any) -> Any:
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc" and obj.size > 0:
        return _SharedArray(obj)
    if isinstance(obj, dict) and type(obj) is dict:
        return {k: _pack(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_pack(v) for v in obj)
    return obj


def _unpack(obj: Any) -> Any:
    if isinstance(obj, _SharedArray):
        return obj.tensor.numpy()
    if isinstance(obj, dict) and type(obj) is dict:
        return {k: _unpack(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_unpack(v) for v in obj)
    return obj


# --------------------------------------------------------------------------------------------
# Worker side.


def _seed_worker(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def _run_task(handler: Callable[[Any], Any], seq: int, payload: Any) -> tuple:
    t0 = time.perf_counter()
    try:
        result = handler(payload)
    except Exhausted:
        return ("exhausted", seq, None, {})
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the consumer
        return ("error", seq, RemoteError(exc), {})
    return ("ok", seq, result, {"worker": time.perf_counter() - t0})


def _process_worker_main(
    factory: HandlerFactory,
    context: WorkerContext,
    task_queue: Any,
    result_conn: mpc.Connection,
    worker_init_fn: Callable[[int], None] | None,
) -> None:
    # Ctrl-C goes to the whole process group; the main process decides, and tears us down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)  # W workers x N intra-op threads would oversubscribe the cores
    parent = os.getppid()
    _seed_worker(context.seed)
    _local.context = context

    def send(msg: tuple) -> bool:
        try:
            if msg[0] == "ok":
                msg = (msg[0], msg[1], _pack(msg[2]), msg[3])
            result_conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return False  # the main process is gone
        except Exception as exc:  # the result did not pickle: report that instead
            result_conn.send(("error", msg[1], RemoteError(exc), {}))
        return True

    try:
        if worker_init_fn is not None:
            worker_init_fn(context.worker_id)
        handler = factory(context)
    except BaseException as exc:  # noqa: BLE001
        send(("error", -1, RemoteError(exc), {}))
        return
    if not send(("ready", -1, None, {})):
        return
    while True:
        try:
            item = task_queue.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned: the training process died
                return
            continue
        except (EOFError, OSError):
            return
        if item is None:
            return
        seq, payload = item
        if not send(_run_task(handler, seq, payload)):
            return


# --------------------------------------------------------------------------------------------
# Main side: backends deliver (worker_id, kind, seq, value, stages) messages.


class _ProcessBackend:
    def __init__(
        self,
        factory: HandlerFactory,
        num_workers: int,
        context: Any,
        base_seed: int,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        self.num_workers = num_workers
        self.task_queues: list[Any] = []
        self.conns: list[mpc.Connection] = []
        self.procs: list[Any] = []
        for w in range(num_workers):
            tq = context.Queue()
            reader, writer = context.Pipe(duplex=False)
            wctx = WorkerContext(w, num_workers, _worker_seed(base_seed, w), "process")
            p = context.Process(
                target=_process_worker_main,
                args=(factory, wctx, tq, writer, worker_init_fn),
                name=f"naiad-worker-{w}",
                daemon=True,
            )
            p.start()
            writer.close()  # the child holds the only write end: EOF on its death
            self.task_queues.append(tq)
            self.conns.append(reader)
            self.procs.append(p)
        self._conn_index = {id(c): i for i, c in enumerate(self.conns)}
        self._sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
        self.dead: set[int] = set()
        self._finalizer = weakref.finalize(
            self, _shutdown_processes, list(self.procs), list(self.task_queues), list(self.conns)
        )

    def submit(self, worker_id: int, seq: int, payload: Any) -> None:
        self.task_queues[worker_id].put((seq, payload))

    def poll(self, timeout_s: float) -> list[tuple[int, str, int, Any, dict]]:
        live_conns = [c for i, c in enumerate(self.conns) if i not in self.dead]
        sentinels = [s for s, i in self._sentinels.items() if i not in self.dead]
        ready = mpc.wait(live_conns + sentinels, timeout=timeout_s)
        out: list[tuple[int, str, int, Any, dict]] = []
        died: list[int] = []
        for r in ready:
            if isinstance(r, int):
                died.append(self._sentinels[r])
                continue
            w = self._conn_index[id(r)]
            conn = self.conns[w]
            try:
                while conn.poll():
                    kind, seq, value, stages = conn.recv()
                    if kind == "ok":
                        value = _unpack(value)
                    out.append((w, kind, seq, value, stages))
            except (EOFError, OSError):
                died.append(w)
            except Exception as exc:  # a result that could not be rebuilt here
                out.append((w, "error", -2, RemoteError(exc), {}))
        for w in sorted(set(died)):
            # Drain what it sent before it died, then report the death.
            conn = self.conns[w]
            try:
                while conn.poll():
                    kind, seq, value, stages = conn.recv()
                    out.append((w, kind, seq, _unpack(value) if kind == "ok" else value, stages))
            except Exception:
                pass
            proc = self.procs[w]
            proc.join(timeout=_POLL_S)
            self.dead.add(w)
            out.append((w, "died", -1, proc.exitcode, {}))
        return out

    def pid(self, worker_id: int) -> int | None:
        return self.procs[worker_id].pid

    def close(self) -> None:
        self._finalizer()


def _shutdown_processes(procs: list[Any], task_queues: list[Any], conns: list[Any]) -> None:
    for tq, p in zip(task_queues, procs):
        if p.is_alive():
            try:
                tq.put_nowait(None)
            except Exception:
                pass
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=1.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=1.0)
    for tq in task_queues:
        tq.cancel_join_thread()  # never block interpreter exit on an unread task
        tq.close()
    for c in conns:
        c.close()
    for p in procs:
        try:
            p.close()
        except ValueError:
            pass


class _ThreadBackend:
    def __init__(
        self,
        factory: HandlerFactory,
        num_workers: int,
        base_seed: int,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        self.num_workers = num_workers
        self.results: queue.Queue = queue.Queue()
        self.task_queues: list[queue.Queue] = [queue.Queue() for _ in range(num_workers)]
        self.dead: set[int] = set()
        self.threads = []
        for w in range(num_workers):
            wctx = WorkerContext(w, num_workers, _worker_seed(base_seed, w), "thread")
            t = threading.Thread(
                target=self._main,
                args=(factory, wctx, self.task_queues[w], worker_init_fn),
                name=f"naiad-worker-{w}",
                daemon=True,
            )
            t.start()
            self.threads.append(t)
        self._finalizer = weakref.finalize(self, _shutdown_threads, self.threads, self.task_queues)

    def _main(
        self,
        factory: HandlerFactory,
        context: WorkerContext,
        tasks: queue.Queue,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        _local.context = context
        w = context.worker_id
        try:
            if worker_init_fn is not None:
                worker_init_fn(w)
            handler = factory(context)
        except BaseException as exc:  # noqa: BLE001
            self.results.put((w, "error", -1, RemoteError(exc), {}))
            return
        self.results.put((w, "ready", -1, None, {}))
        while True:
            item = tasks.get()
            if item is None:
                return
            kind, seq, value, stages = _run_task(handler, *item)
            self.results.put((w, kind, seq, value, stages))

    def submit(self, worker_id: int, seq: int, payload: Any) -> None:
        self.task_queues[worker_id].put((seq, payload))

    def poll(self, timeout_s: float) -> list[tuple[int, str, int, Any, dict]]:
        try:
            out = [self.results.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out

    def pid(self, worker_id: int) -> int | None:
        return os.getpid()

    def close(self) -> None:
        self._finalizer()


def _shutdown_threads(threads: list[threading.Thread], task_queues: list[queue.Queue]) -> None:
    for tq in task_queues:
        tq.put(None)
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    for t in threads:
        # A thread stuck in user code cannot be killed; it is a daemon and dies with the process.
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def _worker_seed(base_seed: int, worker_id: int) -> int:
    return int(np.random.SeedSequence([base_seed % 2**63, worker_id]).generate_state(1, np.uint64)[0] >> 1)


# --------------------------------------------------------------------------------------------


class WorkerPool:
    """Runs ``handler(payload)`` over a stream of tasks in worker processes or threads.

    The handler is built in each worker by ``factory(WorkerContext)``; the factory must be
    picklable for process workers under spawn/forkserver (a top-level function or a
    ``functools.partial`` of one). Results come back in task order (``in_order=True``) or as
    they complete. An exception in the handler is re-raised in the consumer with its own type
    and a note naming the worker and the task; a worker that dies raises :class:`WorkerError`.

    Args:
        factory: builds the handler inside each worker.
        num_workers: 0 runs the handler inline in the calling thread.
        mode: "process" or "thread".
        multiprocessing_context: a start method name or a multiprocessing context.
        timeout_s: the longest wait for one result; None or 0 waits as long as the workers live.
        worker_init_fn: called with the worker id in each worker before the factory.
        base_seed: seeds each worker's ``random``, ``numpy`` and ``torch`` generators.
        describe: turns a payload into words for error messages.

    Example:
        >>> pool = WorkerPool(lambda ctx: (lambda x: x * x), num_workers=0)
        >>> list(pool.imap(range(4)))
        [0, 1, 4, 9]
    """

    def __init__(
        self,
        factory: HandlerFactory,
        *,
        num_workers: int,
        mode: Literal["process", "thread"] = "process",
        multiprocessing_context: str | Any | None = None,
        timeout_s: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        base_seed: int = 0,
        describe: Callable[[Any], str] = lambda payload: f"task {payload!r:.200}",
    ) -> None:
        if num_workers < 0:
            raise ConfigError(f"`num_workers` must be >= 0, got {num_workers}.")
        if mode not in ("process", "thread"):
            raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {mode!r}.")
        self.num_workers = num_workers
        self.mode = mode if num_workers > 0 else "inline"
        self.timeout_s = timeout_s or None
        self._describe = describe
        self._seq = itertools.count()
        self._backend: _ProcessBackend | _ThreadBackend | None = None
        self._inline_handler: Callable[[Any], Any] | None = None
        self._live: set[int] = set()
        self._stale: set[int] = set()  # seqs of abandoned iterations, still owed by workers
        self._ready: set[int] = set()
        self._closed = False
        self.stage_seconds: dict[str, float] = {}
        if num_workers == 0:
            ctx = WorkerContext(0, 0, _worker_seed(base_seed, 0), "inline")
            if worker_init_fn is not None:
                worker_init_fn(0)
            self._inline_handler = factory(ctx)
        elif mode == "thread":
            self._backend = _ThreadBackend(factory, num_workers, base_seed, worker_init_fn)
        else:
            if multiprocessing_context is None or isinstance(multiprocessing_context, str):
                mp_ctx = mp.get_context(multiprocessing_context)
            else:
                mp_ctx = multiprocessing_context
            self._backend = _ProcessBackend(factory, num_workers, mp_ctx, base_seed, worker_init_fn)
        self._live = set(range(num_workers))

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers (the main process's for threads; empty inline)."""
        if self._backend is None:
            return []
        return [self._backend.pid(w) for w in range(self.num_workers)]

    def imap(
        self, tasks: Iterable[Any], *, prefetch: int = 2, in_order: bool = True
    ) -> Iterator[Any]:
        """Yield ``handler(payload)`` for each task, at most ``prefetch`` tasks ahead per worker.

        A task is a payload (sent to workers in turn, task k to worker k mod num_workers, so a
        worker's sequence of tasks, and its random draws, repeat between runs), or a
        :class:`Pinned` payload for one given worker.
        """
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")
        if self._backend is None:
            return self._imap_inline(tasks)
        workers = itertools.cycle(range(self.num_workers))

        def assign() -> Iterator[tuple[int, Any]]:
            for task in tasks:
                if isinstance(task, Pinned):
                    yield task.worker_id, task.payload
                else:
                    yield next(workers), task

        return self._drive(assign(), max(1, prefetch) * self.num_workers, in_order, stop_on_exhausted=False)

    def imap_until_exhausted(
        self, payload_for: Callable[[int], Any], *, prefetch: int = 2, in_order: bool = True
    ) -> Iterator[Any]:
        """Ask the workers in turn for results until every one of them raised :class:`Exhausted`.

        Task k goes to the next worker that has not yet reported exhaustion, with payload
        ``payload_for(worker_id)``; this is how each worker walks its own copy of an iterable.
        """
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")
        if self._backend is None:
            return self._imap_inline_until_exhausted(payload_for)
        active = [True] * self.num_workers
        cycle = itertools.cycle(range(self.num_workers))

        def assign() -> Iterator[tuple[int, Any]]:
            while any(active):
                for _ in range(self.num_workers):
                    w = next(cycle)
                    if active[w]:
                        break
                yield w, payload_for(w)

        return self._drive(
            assign(), max(1, prefetch) * self.num_workers, in_order, stop_on_exhausted=True, active=active
        )

    def _imap_inline(self, tasks: Iterable[Any]) -> Iterator[Any]:
        handler = self._inline_handler
        assert handler is not None
        for task in tasks:
            payload = task.payload if isinstance(task, Pinned) else task
            try:
                yield handler(payload)
            except Exhausted:
                return
            except Exception as exc:
                add_note(exc, f"naiad: raised in the main process while loading {self._describe(payload)}")
                raise

    def _imap_inline_until_exhausted(self, payload_for: Callable[[int], Any]) -> Iterator[Any]:
        handler = self._inline_handler
        assert handler is not None
        while True:
            payload = payload_for(0)
            try:
                result = handler(payload)
            except Exhausted:
                return
            except Exception as exc:
                add_note(exc, f"naiad: raised in the main process while loading {self._describe(payload)}")
                raise
            yield result

    def _drive(
        self,
        assignments: Iterator[tuple[int, Any]],
        capacity: int,
        in_order: bool,
        *,
        stop_on_exhausted: bool,
        active: list[bool] | None = None,
    ) -> Iterator[Any]:
        backend = self._backend
        assert backend is not None
        pending: dict[int, tuple[int, Any]] = {}  # seq -> (worker, payload), in submit order
        order: deque[int] = deque()
        done: dict[int, tuple[str, Any]] = {}
        exhausted_input = False

        def refill() -> None:
            nonlocal exhausted_input
            while not exhausted_input and len(pending) < capacity:
                try:
                    w, payload = next(assignments)
                except StopIteration:
                    exhausted_input = True
                    return
                if w in backend.dead:
                    raise self._death_error(w, backend, None)
                seq = next(self._seq)
                backend.submit(w, seq, payload)
                pending[seq] = (w, payload)
                order.append(seq)

        try:
            refill()
            while pending or done:
                # Deliver what is deliverable.
                while order and (order[0] in done if in_order else done):
                    seq = order.popleft() if in_order else next(iter(done))
                    if not in_order:
                        order.remove(seq)
                    kind, value = done.pop(seq)
                    w, payload = pending.pop(seq)
                    if kind == "ok":
                        yield value
                    elif kind == "exhausted":
                        if active is not None:
                            active[w] = False
                    else:  # error
                        exc = value.rebuild()
                        add_note(exc, f"naiad: raised in worker {w} (pid {backend.pid(w)}) while loading {self._describe(payload)}")
                        raise exc
                    refill()
                if not pending:
                    break
                self._collect(backend, pending, done)
        finally:
            # Results still owed for this iteration are dropped when they arrive.
            self._stale.update(s for s in pending if s not in done)

    def _collect(self, backend: Any, pending: dict[int, tuple[int, Any]], done: dict[int, tuple[str, Any]]) -> None:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            wait_s = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            messages = backend.poll(wait_s)
            got = False
            for w, kind, seq, value, stages in messages:
                if kind == "ready":
                    self._ready.add(w)
                    continue
                if kind == "died":
                    owed = {s: t for s, t in pending.items() if s not in done}
                    raise self._death_error(w, backend, value, owed)
                if seq == -1:  # the worker could not build its handler
                    exc = value.rebuild()
                    add_note(exc, f"naiad: raised in worker {w} while starting (worker_init_fn or dataset set-up)")
                    raise exc
                for name, s in stages.items():
                    self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + s
                if seq in self._stale:
                    self._stale.discard(seq)
                    continue
                if seq in pending:
                    done[seq] = (kind, value)
                    got = True
                elif seq == -2:
                    raise value.rebuild()
            if got:
                return
            if deadline is not None and time.monotonic() >= deadline:
                w = next(iter(pending.values()))[0]
                raise WorkerError(
                    f"no result from worker {w} within timeout={self.timeout_s} s while loading "
                    f"{self._describe(next(iter(pending.values()))[1])}; raise `timeout` or find what blocks the dataset.",
                    worker_id=w,
                )

    def _death_error(
        self, w: int, backend: Any, exitcode: int | None, pending: dict[int, tuple[int, Any]] | None = None
    ) -> WorkerError:
        held = [p for (wid, p) in (pending or {}).values() if wid == w]
        doing = f"while loading {self._describe(held[0])}" if held else "while idle"
        if exitcode is not None and exitcode < 0:
            try:
                how = f"killed by signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        hint = ""
        if exitcode == -signal.SIGKILL:
            hint = " (SIGKILL often means the out-of-memory killer: fewer workers or smaller batches use less memory)"
        return WorkerError(
            f"naiad worker {w} (pid {backend.pid(w)}) {how} {doing}{hint}.",
            worker_id=w,
            exitcode=exitcode,
            task=doing,
        )

    def close(self) -> None:
        """Stop the workers: ask, wait, then terminate and kill. Safe to call more than once."""
        self._closed = True
        if self._backend is not None:
            self._backend.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
