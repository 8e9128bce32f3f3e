"""The process workers behind a WorkerPool, and what both kinds of workers share (threads:
:mod:`naiad.parallel.thread_backend`).

A backend starts and stops workers by id, hands a worker one task at a time and delivers
``(worker_id, kind, seq, value, stage_seconds)`` messages (see NOTE [ Worker protocol ] in
:mod:`naiad.parallel.pool`). It knows nothing of order, epochs or errors' meaning: the pool does.
"""

from __future__ import annotations

import ctypes
import multiprocessing.connection as mpc
import os
import pickle
import queue
import signal
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.parallel.context import (
    WorkerContext,
    enter,
    seed_globals,
    take_stages,
    task_seed_sequence,
)
from naiad.parallel.transport import pack

__all__ = ["Exhausted", "RemoteError", "add_note"]

# How often a blocked wait wakes up to check that the other side is alive.
POLL_S = 0.5
# Grace for a worker to finish its task and return before it is terminated: a worker busy on
# a task nobody will read (after a `break` or an error) need not be waited for.
JOIN_TIMEOUT_S = 1.0

Message = tuple[int, str, int, Any, dict]
InitFn = Callable[[int], None] | None
PrepareFn = Callable[[WorkerContext], None] | None


class Exhausted(Exception):
    """Raised by a handler to say this worker has nothing more to give (an iterable ran out)."""


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


class RemoteError:
    """An exception raised in a worker, carried to the consumer with its type, message and traceback."""

    def __init__(self, exc: BaseException) -> None:
        self.tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            # Most exceptions pickle; keeping the object keeps its type, args, notes and attributes.
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


def worker_seed(base_seed: int, worker_id: int) -> int:
    """The per-worker seed a :class:`WorkerContext` reports (and that seeds a worker at start).

    torch's: ``base_seed + worker_id`` (what its ``get_worker_info().seed`` reports).
    """
    return base_seed + worker_id


def run_task(handler: Callable[[Any], Any], seq: int, payload: Any) -> tuple:
    """Run one task; the message that answers it."""
    t0, c0 = time.perf_counter(), time.thread_time()
    take_stages()  # a failed task's leftovers are not this one's
    try:
        result = handler(payload)
    except Exhausted:
        return ("exhausted", seq, None, {})
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the consumer
        return ("error", seq, RemoteError(exc), {})
    # Wall and CPU time: a thread's CPU time is what the read-ahead tuner weighs against the
    # rest of the process (NOTE [ Tuned read-ahead ]).
    stages = {"worker": time.perf_counter() - t0, "worker_cpu": time.thread_time() - c0}
    stages.update(take_stages())  # parts of the task the handler timed apart (report_stage)
    return ("ok", seq, result, stages)


# --------------------------------------------------------------------------------------------
# Process workers.


def _seed_at_start(context: WorkerContext) -> None:
    # Exactly as torch seeds its worker processes, before worker_init_fn: set-up code sees
    # seeded generators, and a worker_init_fn that draws or seeds from them acts as in torch.
    import random

    import torch
    from torch.utils.data._utils.worker import _generate_state

    seed = context.seed
    random.seed(seed)
    torch.manual_seed(seed & (2**64 - 1))
    np.random.seed(_generate_state(context.base_seed & (2**64 - 1), context.worker_id))


# NOTE [ Worker heap ]
# glibc's malloc serves a big block (a batch's decoded pixels, a read's arrays: megabytes) with its
# own mmap at first, and unmaps it when freed; but each such free raises the threshold (up to 32
# MiB), after which blocks of those sizes come from the heap, where blocks of varying sizes freed
# in between fragment it. A worker process allocating a few such blocks per task then grew by
# megabytes an epoch, without end over 20 epochs although it kept nothing (bench/bench_soak.py:
# 28x28 PNGs decoded in the reads, 6 MiB an epoch per worker). A fixed threshold keeps every block
# of MMAP_THRESHOLD bytes or more mapped on its own and given back when freed: the worker stays
# flat, for a page-fault cost per big block that is small beside the work that fills it.

MMAP_THRESHOLD = 1 << 20
"""Bytes from which a worker process's ``malloc`` maps each block on its own (NOTE [ Worker heap ])."""

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` in this process (NOTE [ Worker
    heap ]); whether it was set (only glibc has ``mallopt``; elsewhere this does nothing)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def _process_worker_main(
    factory: Callable[[WorkerContext], Callable[[Any], Any]],
    context: WorkerContext,
    task_queue: Any,
    result_conn: mpc.Connection,
    worker_init_fn: InitFn,
    prepare: PrepareFn = None,
) -> None:
    # Ctrl-C goes to the whole process group; the main process decides, and tears us down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)  # W workers x N intra-op threads would oversubscribe the cores
    fix_mmap_threshold()
    parent = os.getppid()
    _seed_at_start(context)
    enter(context, None)
    # NOTE [ Worker randomness ]: a worker_init_fn owns the global generators from then on.
    reseed = worker_init_fn is None

    def send(msg: tuple) -> bool:
        try:
            if msg[0] == "ok":
                msg = (msg[0], msg[1], pack(msg[2]), msg[3])
            result_conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return False  # the main process is gone
        except Exception as exc:  # the result did not pickle: report that instead
            result_conn.send(("error", msg[1], RemoteError(exc), {}))
        return True

    try:
        if prepare is not None:
            prepare(context)
        if worker_init_fn is not None:
            worker_init_fn(context.worker_id)
        handler = factory(context)
    except BaseException as exc:  # noqa: BLE001
        send(("error", -1, RemoteError(exc), {}))
        return
    if not send(("ready", -1, None, {})):
        return
    current: tuple[int, int] | None = None
    while True:
        try:
            item = task_queue.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned: the training process died
                return
            continue
        except (EOFError, OSError):
            return
        if item is None:
            return
        seq, payload, key = item
        if len(key) > 2:  # NOTE [ Worker randomness ]: a task with its own seed sequence
            current = None
            enter(context, key[1], fresh=True, entropy=key[2])
            if reseed:
                seed_globals(task_seed_sequence(key[2]))
        elif key != current:  # fresh generators each pass
            current = key
            epoch = key[1]
            enter(context, epoch, fresh=True)
            if reseed:
                seed_globals(context.seed_sequence(epoch))
        if not send(run_task(handler, seq, payload)):
            return


class ProcessBackend:
    """Worker processes, each with a task queue and a result pipe; workers start and stop by id."""

    def __init__(
        self,
        factory: Callable[[WorkerContext], Callable[[Any], Any]],
        context: Any,
        base_seed: int,
        rank: int,
        worker_init_fn: InitFn,
        prepare: PrepareFn = None,
    ) -> None:
        self._factory = factory
        self._mp = context
        self._base_seed = base_seed
        self._rank = rank
        self._init = worker_init_fn
        self._prepare = prepare
        self.task_queues: list[Any] = []
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        self.dead: set[int] = set()
        self.stopping: set[int] = set()  # asked to return; their exit is not a failure
        self.forced: set[int] = set()  # stopping, but ended by a signal: the message failed
        self._conn_index: dict[int, int] = {}
        # The finalizer holds the same lists, so it also sees workers started later; it holds
        # nothing that holds the backend, so dropping the pool stops the workers at once.
        self._finalizer = weakref.finalize(
            self, _shutdown_processes, os.getpid(), self.procs, self.task_queues, self.conns
        )

    def start(self, w: int, num_workers: int) -> None:
        """Start worker ``w`` (replacing a stopped worker of that id)."""
        if w < len(self.procs):
            self._release(w)
        tq = self._mp.Queue()
        # NOTE [ Exit with tasks in flight ]: multiprocessing joins a queue's feeder thread when
        # the process exits, and a feeder blocked writing tasks into a full pipe to a worker
        # that is stopped (or busy) never returns, so a process that raises while it holds a
        # pass would never exit (pytorch#48666). Tasks unsent at exit are worthless: never join
        # the feeder, as torch does for its index queues.
        tq.cancel_join_thread()
        reader, writer = self._mp.Pipe(duplex=False)
        wctx = WorkerContext(
            w, num_workers, worker_seed(self._base_seed, w), "process", self._base_seed, self._rank
        )
        p = self._mp.Process(
            target=_process_worker_main,
            args=(self._factory, wctx, tq, writer, self._init, self._prepare),
            name=f"naiad-worker-{w}",
            daemon=True,
        )
        try:
            p.start()
        except (TypeError, AttributeError, pickle.PicklingError) as exc:
            # spawn and forkserver pickle what the worker needs. torch warns here with these
            # opening words (its own tests look for them); the note names the argument.
            reader.close()
            writer.close()
            tq.close()
            hint = _unpicklable_hint(w, self._mp, self._factory, self._init, self._prepare)
            warnings.warn(
                f"Got pickle error when attempting to start a worker Process. {hint}",
                UserWarning,
                stacklevel=2,
            )
            add_note(exc, hint)
            raise
        writer.close()  # the child holds the only write end: EOF on its death
        if w < len(self.procs):
            self.task_queues[w], self.conns[w], self.procs[w] = tq, reader, p
        else:
            self.task_queues.append(tq)
            self.conns.append(reader)
            self.procs.append(p)
        self._conn_index = {id(c): i for i, c in enumerate(self.conns)}
        self.dead.discard(w)
        self.stopping.discard(w)
        self.forced.discard(w)

    def _release(self, w: int) -> None:
        # The old worker of this id was asked to return and owes nothing: wait for it briefly.
        _shutdown_processes(os.getpid(), [self.procs[w]], [self.task_queues[w]], [self.conns[w]])

    def stop(self, w: int) -> None:
        """Ask worker ``w`` to return once its queued tasks are done; one that cannot be asked
        (its stop message fails to send) owes nothing and is terminated, then killed."""
        self.stopping.add(w)
        try:
            self.task_queues[w].put(None)
        except Exception:  # noqa: BLE001 - whatever failed, the worker is never told: end it
            self.forced.add(w)
            _end_process(self.procs[w], grace_s=0.0)

    def submit(self, worker_id: int, seq: int, payload: Any, key: tuple) -> None:
        """Queue a task; ``key`` is (pass id, epoch) or (pass id, epoch, the task's seed keys)."""
        self.task_queues[worker_id].put((seq, payload, key))

    def _drain(self, w: int, out: list[Message]) -> None:
        conn = self.conns[w]
        while conn.poll():
            kind, seq, value, stages = conn.recv()
            out.append((w, kind, seq, value, stages))

    def poll(self, timeout_s: float) -> list[Message]:
        live = [i for i in range(len(self.procs)) if i not in self.dead]
        sentinels = {self.procs[i].sentinel: i for i in live}
        ready = mpc.wait([self.conns[i] for i in live] + list(sentinels), timeout=timeout_s)
        out: list[Message] = []
        ended: list[int] = []
        for r in ready:
            if isinstance(r, int):
                ended.append(sentinels[r])
                continue
            w = self._conn_index[id(r)]
            try:
                self._drain(w, out)
            except (EOFError, OSError):
                ended.append(w)
            except Exception as exc:  # a result that could not be rebuilt here
                out.append((w, "error", -2, RemoteError(exc), {}))
        for w in sorted(set(ended)):
            # Deliver what it sent before it ended, then report how it ended.
            try:
                self._drain(w, out)
            except Exception:
                pass  # a large result's shared memory goes with its sender: the death is reported
            proc = self.procs[w]
            proc.join(timeout=POLL_S)
            self.dead.add(w)
            stopped = w in self.stopping and (proc.exitcode == 0 or w in self.forced)
            if proc.exitcode != 0 and proc.pid is not None:
                remove_shm_of(proc.pid)
            out.append((w, "retired" if stopped else "died", -1, proc.exitcode, {}))
        return out

    def pid(self, worker_id: int) -> int | None:
        return self.procs[worker_id].pid

    def exitcode(self, worker_id: int) -> int | None:
        """How worker ``worker_id`` ended (None: it runs)."""
        return self.procs[worker_id].exitcode

    def handles(self) -> list[Any]:
        """The workers' ``multiprocessing.Process`` objects, the ones stopped too: they stay
        usable (``join``, ``is_alive``, ``exitcode``) after teardown, as torch's ``_workers``."""
        return list(self.procs)

    def close(self) -> None:
        self._finalizer()


def _named_parts(label: str, value: Any) -> list[tuple[str, Any]]:
    """``value`` and, for a ``functools.partial``, its arguments, named by the function's parameters."""
    func = getattr(value, "func", None)
    if func is None:
        return [(label, value)]
    try:
        import inspect

        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        names = []
    parts = [(names[i] if i < len(names) else f"{label}'s argument {i}", arg) for i, arg in enumerate(value.args)]
    return [*parts, *value.keywords.items()]


def _unpicklable_hint(w: int, mp_context: Any, factory: Any, init: InitFn, prepare: PrepareFn) -> str:
    """What a worker could not be started with, in words: which argument does not pickle, and the fixes."""
    from multiprocessing.reduction import ForkingPickler

    parts = [*_named_parts("the handler factory", factory), ("worker_init_fn", init),
             *_named_parts("the worker set-up", prepare)]
    culprits, seen = [], set()
    for name, value in parts:
        if id(value) in seen:
            continue
        seen.add(id(value))
        try:
            ForkingPickler.dumps(value)
        except Exception as err:  # noqa: BLE001 - any failure to pickle is what we look for
            culprits.append(f"`{name}` ({type(value).__name__}: {err})")
    what = "; ".join(culprits) if culprits else "an argument of the worker"
    method = getattr(mp_context, "get_start_method", lambda: "?")()
    return (
        f"naiad: could not start worker {w}: with the {method!r} start method everything a "
        f"worker needs is pickled, and this does not pickle: {what}. Define functions and "
        "classes at the top level of a module (not lambdas, local functions or classes in an "
        "interactive __main__); build state that cannot be pickled (open files, sessions, "
        "locks) inside each worker with naiad.WorkerLocal; or use worker_mode='thread' or the "
        "'fork' start method, which pickle nothing."
    )


def _end_process(p: Any, grace_s: float) -> None:
    """Wait ``grace_s`` for ``p`` to return, then terminate it, then kill it."""
    p.join(timeout=grace_s)
    if p.is_alive():
        p.terminate()
        p.join(timeout=1.0)
    if p.is_alive():
        p.kill()
        p.join(timeout=1.0)


def _shutdown_processes(owner_pid: int, procs: list[Any], task_queues: list[Any], conns: list[Any]) -> None:
    """Stop worker processes: ask each to return, wait, then terminate and kill.

    Each worker is asked with a ``None`` task; asking can fail (the queue closed, no thread
    left to start its feeder at interpreter exit), and waiting can be cut short by a worker
    that never reads its queue: either way the escalation that follows ends it. The Process
    objects are not closed: they stay usable after teardown (``join``, ``is_alive``,
    ``exitcode``) for whoever holds them, and release their descriptors when collected.
    """
    if os.getpid() != owner_pid:
        return  # a forked child's copy of the pool: the workers are its parent's to stop
    for tq, p in zip(task_queues, procs):
        if p.is_alive():
            try:
                tq.put_nowait(None)
            except Exception:  # noqa: BLE001 - not told: the escalation below ends it
                pass
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for p in procs:
        _end_process(p, grace_s=max(0.0, deadline - time.monotonic()))
    for tq in task_queues:
        tq.cancel_join_thread()  # never block interpreter exit on an unread task
        tq.close()
    for c in conns:
        c.close()


def remove_shm_of(pid: int, root: str = "/dev/shm") -> None:
    """Unlink the shared-memory files a dead worker left: torch names the segment of a tensor
    it shares ``torch_<pid>_...`` and unlinks it once the file descriptor has crossed, so a
    worker killed between the two leaves one behind."""
    try:
        names = [n for n in os.listdir(root) if n.startswith(f"torch_{pid}_")]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(root, name))
        except OSError:
            pass
