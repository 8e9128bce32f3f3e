"""The process workers behind a WorkerPool: started, told their tasks, watched, torn down.

A backend starts and stops workers by id, hands a worker its tasks and delivers each worker's
messages as ``(worker_id, kind, seq, value, stage_seconds)`` (NOTE [ Worker protocol ] in
:mod:`naiad.parallel.protocol`), adding its own news of a worker: how it ended. It knows nothing
of order, epochs or errors' meaning: the pool does. A worker process's own side (its set-up,
its task source, its replies) is :mod:`naiad.parallel.worker_process`; what any worker runs once
set up, :mod:`naiad.parallel.worker_side`; thread workers, :mod:`naiad.parallel.thread_backend`.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import select
import sys
import time
import warnings
import weakref
from multiprocessing.process import BaseProcess
from typing import Any

from naiad.parallel import slots
from naiad.parallel.channel import TaskChannel
from naiad.parallel.protocol import (
    NO_TASK,
    STOP,
    Exhausted,
    Kind,
    Message,
    RemoteError,
    Task,
    TaskKey,
    add_note,
    from_wire,
)
from naiad.parallel.worker_process import POLL_S, process_worker_main
from naiad.parallel.worker_side import WorkerSpec

__all__ = ["Exhausted", "ProcessBackend", "RemoteError", "add_note"]

# Grace for a worker to finish its task and return before it is terminated: a worker busy on
# a task nobody will read (after a `break` or an error) need not be waited for.
JOIN_TIMEOUT_S = 1.0

_LOG = logging.getLogger("naiad.workers")
_SLOT = Kind.SLOT.value


class ProcessBackend:
    """Worker processes, each with a socket pair for its tasks and its results; workers start
    and stop by id."""

    def __init__(self, spec: WorkerSpec, context: Any) -> None:
        self._spec = spec
        self._mp = context
        self.channels: list[TaskChannel] = []  # tasks out (NOTE [ Task channel ])
        self.conns: list[Any] = []
        self.procs: list[BaseProcess] = []
        self.dead: set[int] = set()
        self.stopping: set[int] = set()  # asked to return; their exit is not a failure
        self.forced: set[int] = set()  # stopping, but ended by a signal: the message failed
        self._slot_tokens: dict[int, int] = {}  # worker id -> the token naming its slots here
        self._running: dict[int, Any] = {}  # worker id -> the shared number of the task it runs
        self._waiting: tuple[Any, dict[int, tuple[int, bool]]] | None = None  # kept by _poll_set
        # The finalizer holds the same lists, so it also sees workers started later; it holds
        # nothing that holds the backend, so dropping the pool stops the workers at once.
        self._finalizer = weakref.finalize(
            self, _shutdown_processes, os.getpid(), self.procs, self.channels, self.conns
        )

    def start(self, w: int, num_workers: int) -> None:
        """Start worker ``w`` (replacing a stopped worker of that id)."""
        if w < len(self.procs):
            self._release(w)
        # A socket pair: tasks out, results and slot descriptors back (NOTE [ Task channel ]).
        reader, writer = self._mp.Pipe(duplex=True)
        # The task the worker runs now: of a bundle's tasks, which one its death interrupted.
        running = self._mp.RawValue("q", -1)
        inherited: tuple[int, ...] = ()
        if getattr(self._mp, "get_start_method", lambda: "")() == "fork":  # spawn passes only what it pickles
            ends = [*self.conns, *self.channels, reader]
            inherited = tuple(fd for fd in (_fileno(e) for e in ends) if fd is not None)
        p = self._mp.Process(
            target=process_worker_main,
            args=(self._spec, self._spec.context(w, num_workers, "process"), writer, inherited, running),
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
            hint = _unpicklable_hint(w, self._mp, self._spec)
            warnings.warn(
                f"Got pickle error when attempting to start a worker Process. {hint}",
                UserWarning,
                stacklevel=2,
            )
            add_note(exc, hint)
            raise
        writer.close()  # the child holds the only other end: EOF on its death
        channel = TaskChannel(reader)
        if w < len(self.procs):
            self.channels[w], self.conns[w], self.procs[w] = channel, reader, p
        else:
            self.channels.append(channel)
            self.conns.append(reader)
            self.procs.append(p)
        self._running[w] = running
        self.dead.discard(w)
        self._waiting = None  # another socket and sentinel to wait on
        self.stopping.discard(w)
        self.forced.discard(w)

    def _release(self, w: int) -> None:
        # The old worker of this id was asked to return and owes nothing: wait for it briefly.
        _shutdown_processes(os.getpid(), [self.procs[w]], [self.channels[w]], [self.conns[w]])

    def stop(self, w: int) -> None:
        """Ask worker ``w`` to return once its queued tasks are done; one that cannot be asked
        (its stop message fails to send) owes nothing and is terminated, then killed."""
        self.stopping.add(w)
        try:
            self.channels[w].put(STOP)
        except Exception:  # noqa: BLE001 - whatever failed, the worker is never told: end it
            self.forced.add(w)
            p = self.procs[w]
            how = _end_process(p, grace_s=0.0)
            _LOG.info("worker %d (pid %s) could not be told to stop: %s, exit code %s", w, p.pid, how, p.exitcode)

    def submit(self, worker_id: int, seq: int, payload: Any, key: TaskKey) -> None:
        """Send a task (never blocking: NOTE [ Task channel ]); ``key`` is (pass id, epoch) or
        (pass id, epoch, the task's seed keys)."""
        slots.collect()  # the worker may need a slot for it: those of batches gone are free
        self.channels[worker_id].put((seq, payload, key))

    def submit_bundle(self, worker_id: int, tasks: list[Task]) -> None:
        """Send several tasks in one message (NOTE [ Task bundles ] in :mod:`naiad.parallel.passes`)."""
        slots.collect()
        self.channels[worker_id].put(tasks)

    def _drain(self, w: int, out: list[Message]) -> None:
        conn = self.conns[w]
        ready = select.poll()  # not conn.poll(): it builds a selector per call, twice a batch
        ready.register(conn.fileno(), select.POLLIN)
        while ready.poll(0):
            wire = conn.recv()
            if type(wire) is list:  # a bundle's replies
                out.extend([from_wire(w, one) for one in wire])
            elif wire[0] == _SLOT:
                token, index, size = wire[2]
                slots.receive(conn, token, index, size)
                self._slot_tokens[w] = token
            else:
                out.append(from_wire(w, wire))

    def _receive(self, w: int, out: list[Message]) -> bool:
        """Take in what worker ``w`` sent; False when its socket says it has ended."""
        try:
            self._drain(w, out)
        except (EOFError, OSError):
            return False
        except Exception as exc:  # a message that did not unpickle here, or of no known kind
            out.append((w, Kind.UNREADABLE, NO_TASK, exc, {}))
        return True

    def _report_end(self, w: int, out: list[Message]) -> None:
        """Deliver what worker ``w`` sent before it ended, then how it ended."""
        try:
            self._drain(w, out)
        except Exception:
            pass  # a large result's shared memory goes with its sender: the death is reported
        proc = self.procs[w]
        proc.join(timeout=POLL_S)
        self.dead.add(w)
        self._waiting = None
        if w in self._slot_tokens:
            slots.forget(self._slot_tokens.pop(w))
        stopped = w in self.stopping and (proc.exitcode == 0 or w in self.forced)
        if proc.exitcode != 0 and proc.pid is not None:
            remove_shm_of(proc.pid)
        out.append((w, Kind.RETIRED if stopped else Kind.DIED, NO_TASK, proc.exitcode, {}))

    def _poll_set(self) -> tuple[Any, dict[int, tuple[int, bool]]]:
        """What a wait polls: the live workers' sockets (and the room in those whose tasks wait
        for it) and sentinels, with each descriptor's worker and whether it is a sentinel. Kept
        while the same workers live and no task waits (a wait a batch: building it anew costs
        more than the poll)."""
        live = [i for i in range(len(self.procs)) if i not in self.dead]
        room = {i for i in live if self.channels[i].pending and not self.channels[i].flush()}
        if self._waiting is not None and not room:
            return self._waiting
        waiting, owner = select.poll(), {}
        for i in live:
            fd, sentinel = self.conns[i].fileno(), self.procs[i].sentinel
            waiting.register(fd, select.POLLIN | (select.POLLOUT if i in room else 0))
            waiting.register(sentinel, select.POLLIN)
            owner[fd], owner[sentinel] = (i, False), (i, True)
        if not room:
            self._waiting = (waiting, owner)
        return waiting, owner

    def poll(self, timeout_s: float) -> list[Message]:
        """The workers' messages, waiting up to ``timeout_s`` for the first; a worker's end
        (its sentinel, or EOF on its socket) comes after what it sent before it. Tasks waiting
        for room in a worker's socket go out meanwhile (NOTE [ Task channel ])."""
        slots.collect()  # the slots of batches gone since the last wait go back to their workers
        deadline = time.monotonic() + timeout_s
        while True:
            waiting, owner = self._poll_set()
            left = deadline - time.monotonic()
            events = [(fd, ev) for fd, ev in waiting.poll(max(0, math.ceil(left * 1000))) if ev != select.POLLOUT]
            if events or left <= 0:
                break
        out: list[Message] = []
        ended = {owner[fd][0] for fd, _ in events if owner[fd][1]}
        for fd, _ in events:
            w, sentinel = owner[fd]
            if not sentinel and not self._receive(w, out):
                ended.add(w)
        for w in sorted(ended):
            self._report_end(w, out)
        return out

    def pid(self, worker_id: int) -> int | None:
        """Worker ``worker_id``'s process id."""
        return self.procs[worker_id].pid

    def running(self, worker_id: int) -> int | None:
        """The sequence number of the task worker ``worker_id`` began last (None: none yet)."""
        shared = self._running.get(worker_id)
        seq = int(shared.value) if shared is not None else -1
        return seq if seq >= 0 else None

    def exitcode(self, worker_id: int) -> int | None:
        """How worker ``worker_id`` ended (None: it runs)."""
        return self.procs[worker_id].exitcode

    def handles(self) -> list[Any]:
        """The workers' ``multiprocessing.Process`` objects, the ones stopped too: they stay
        usable (``join``, ``is_alive``, ``exitcode``) after teardown, as torch's ``_workers``."""
        return list(self.procs)

    def close(self) -> None:
        """Stop the workers: ask, wait, then terminate and kill (see :func:`_shutdown_processes`)."""
        self._finalizer()
        # Late in the interpreter's shutdown a module's globals are None (``sys`` too).
        finalizing = getattr(sys, "is_finalizing", None)
        if finalizing is None or finalizing():
            return  # the interpreter is going: nothing is left to forget the slots for
        for token in self._slot_tokens.values():
            slots.forget(token)  # batches still held keep their own mappings
        self._slot_tokens.clear()


def _fileno(end: Any) -> int | None:
    """A connection's or channel's descriptor; None once it is closed."""
    try:
        return int(end.fileno())
    except (OSError, ValueError, AttributeError):
        return None


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


def _unpicklable_hint(w: int, mp_context: Any, spec: WorkerSpec) -> str:
    """What a worker could not be started with, in words: which argument does not pickle, and the fixes."""
    from multiprocessing.reduction import ForkingPickler

    parts = [*_named_parts("the handler factory", spec.factory), ("worker_init_fn", spec.worker_init_fn),
             *_named_parts("the worker set-up", spec.prepare)]
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


def _end_process(p: Any, grace_s: float) -> str:
    """Wait ``grace_s`` for ``p`` to return, then terminate it, then kill it; how it ended:
    ``"returned"``, ``"terminated"`` or ``"killed"``."""
    p.join(timeout=grace_s)
    how = "returned"
    if p.is_alive():
        how = "terminated"
        p.terminate()
        p.join(timeout=1.0)
    if p.is_alive():
        how = "killed"
        p.kill()
        p.join(timeout=1.0)
    return how


def _shutdown_processes(owner_pid: int, procs: list[Any], channels: list[Any], conns: list[Any]) -> None:
    """Stop worker processes: ask each to return, wait, then terminate and kill.

    Each worker is asked with a ``STOP`` task; asking can fail (its socket full or closed), and
    waiting can be cut short by a worker that never reads its tasks: either way the escalation
    that follows ends it. The Process objects are not closed: they stay usable after teardown
    (``join``, ``is_alive``, ``exitcode``) for whoever holds them, and release their
    descriptors when collected.
    """
    if os.getpid() != owner_pid:
        return  # a forked child's copy of the pool: the workers are its parent's to stop
    running = [p.is_alive() for p in procs]
    for channel, alive in zip(channels, running):
        if alive:
            try:
                channel.put_nowait(STOP)
            except Exception:  # noqa: BLE001 - not told: the escalation below ends it
                pass
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for p, alive in zip(procs, running):
        how = _end_process(p, grace_s=max(0.0, deadline - time.monotonic()))
        if alive:  # the routine end is DEBUG; one that had to be forced, INFO
            _LOG.log(logging.DEBUG if how == "returned" else logging.INFO,
                     "%s (pid %s) %s at teardown, exit code %s", p.name, p.pid, how, p.exitcode)
    for channel in channels:
        channel.close()
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
