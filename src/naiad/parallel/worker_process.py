"""Inside a worker process: its set-up, its loop's task source, and how it sends its replies.

A process worker is started by :class:`~naiad.parallel.backend.ProcessBackend` with
:func:`process_worker_main`: it closes the training process's socket ends it inherited, seeds its
generators as torch seeds its workers, and runs :func:`~naiad.parallel.worker_side.serve` over
the tasks it receives (NOTE [ Task channel ]), sending each reply, or a bundle's replies in one
message (NOTE [ Task bundles ] in :mod:`naiad.parallel.passes`), with its arrays in a batch slot
(NOTE [ Batch transport ]). It returns when told to stop, when its socket closes, or when its
parent is gone.
"""

from __future__ import annotations

import functools
import multiprocessing.connection as mpc
import os
import pickle
import select
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np

from naiad.parallel import slots
from naiad.parallel.context import WorkerContext
from naiad.parallel.heap import HeapTrimmer, fix_mmap_threshold
from naiad.parallel.protocol import (
    ERROR,
    NO_TASK,
    OK,
    STOP,
    Kind,
    RemoteError,
    Reply,
    Task,
    to_wire,
)
from naiad.parallel.transport import pack
from naiad.parallel.worker_side import WorkerSpec, serve

__all__ = ["POLL_MS", "POLL_S", "process_worker_main"]

# How often a blocked wait wakes up to check that the other side is alive (here: that the
# training process still is; there, that the worker does).
POLL_S = 0.5
POLL_MS = int(POLL_S * 1000)


def _set_up_process(context: WorkerContext) -> None:
    # Ctrl-C goes to the whole process group; the main process decides, and tears us down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import random

    import torch
    from torch.utils.data._utils.worker import _generate_state

    torch.set_num_threads(1)  # W workers x N intra-op threads would oversubscribe the cores
    fix_mmap_threshold()
    # Exactly as torch seeds its worker processes, before worker_init_fn: set-up code sees
    # seeded generators, and a worker_init_fn that draws or seeds from them acts as in torch.
    random.seed(context.seed)
    torch.manual_seed(context.seed & (2**64 - 1))
    # _generate_state: torch's private helper, unannotated.
    np.random.seed(_generate_state(context.base_seed & (2**64 - 1), context.worker_id))  # type: ignore[no-untyped-call]


def process_worker_main(spec: WorkerSpec, context: WorkerContext, conn: mpc.Connection,
                        inherited: tuple[int, ...], running: Any) -> None:
    """A worker process's whole life: ``conn`` its socket to the training process, ``inherited``
    the training process's descriptors it holds after a fork, ``running`` the shared integer
    it writes each task's number into as it begins it."""
    # A forked worker holds copies of the training process's ends of the sockets (its own and
    # the workers' started before it). Held here, they would keep a blocked send of a result
    # from failing once the training process is gone, and the worker would outlive it.
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    parent = os.getppid()
    _set_up_process(context)
    # NOTE [ Worker randomness ]: a worker_init_fn owns the global generators from then on.
    held = slots.WorkerSlots(functools.partial(_announce, conn)) if slots.supported() else None
    slots.use(held)
    serve(spec, context, _received_tasks(conn, parent), functools.partial(_send, conn, held),
          reseed=spec.worker_init_fn is None, send_bundle=functools.partial(_send_bundle, conn, held),
          started=functools.partial(setattr, running, "value"))


def _received_tasks(conn: mpc.Connection, parent: int) -> Iterator[Task | list[Task]]:
    """The tasks sent to this worker (NOTE [ Task channel ]), until it is told to stop, its
    socket closes or its parent is gone."""
    # One poll set for the worker's life: ``Connection.poll`` builds a selector each call, a few
    # µs of every task.
    waiting = select.poll()
    waiting.register(conn.fileno(), select.POLLIN)
    heap = HeapTrimmer()
    while True:
        try:
            if not waiting.poll(POLL_MS):  # readable, closed or in error: recv tells which
                if os.getppid() != parent:  # orphaned: the training process died
                    return
                heap.idle()
                continue
            heap.task()
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is STOP:
            return
        yield task


def _announce(result_conn: mpc.Connection, token: int, index: int, size: int, fd: int) -> None:
    """Tell the main process of a new slot, then pass it the slot's descriptor (NOTE [ Batch transport ])."""
    from multiprocessing.reduction import send_handle

    result_conn.send((Kind.SLOT._value_, NO_TASK, (token, index, size), {}))
    send_handle(result_conn, fd, os.getppid())


def _send(result_conn: mpc.Connection, held: slots.WorkerSlots | None, reply: Reply) -> bool:
    """Send ``reply`` to the main process; False when it is gone (NOTE [ Worker protocol ])."""
    kind, seq, value, stages = reply
    try:
        if kind is OK:
            reply = (kind, seq, held.pack(value) if held is not None else pack(value), stages)
        if held is not None and held.in_slot:
            # Its arrays are in a slot: nothing left needs multiprocessing's reducers (torch's
            # shared memory), and the C pickler is a third of ForkingPickler's cost per batch.
            result_conn.send_bytes(pickle.dumps(to_wire(reply), pickle.HIGHEST_PROTOCOL))
        else:
            result_conn.send(to_wire(reply))
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False  # the main process is gone
    except Exception as exc:  # the result did not pickle (only a result can fail): report that instead
        if held is not None:
            held.unsent()
        result_conn.send(to_wire((ERROR, seq, RemoteError(exc), {})))
    finally:
        if held is not None:
            held.end_task()
    return True


def _send_bundle(result_conn: mpc.Connection, held: slots.WorkerSlots | None, replies: list[Reply]) -> bool:
    """Send a bundle's replies in one message, their results in one slot (NOTE [ Task bundles ]
    in :mod:`naiad.parallel.passes`); one by one when they do not pickle together, so that only
    the task whose result fails to pickle fails."""
    values = [value for kind, _, value, _ in replies if kind is OK]
    try:
        packed = iter(held.pack(values) if held is not None else pack(values))
        wire = [to_wire((kind, seq, next(packed) if kind is OK else value, stages))
                for kind, seq, value, stages in replies]
        if held is not None and held.in_slot:
            result_conn.send_bytes(pickle.dumps(wire, pickle.HIGHEST_PROTOCOL))
        else:
            result_conn.send(wire)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False  # the main process is gone
    except Exception:  # noqa: BLE001 - a result did not pickle: each alone, so that only its task fails
        if held is not None:
            held.unsent()
        # Not through the slots: the others' arrays may lie in the bundle's slot, free again now.
        return all([_send(result_conn, None, reply) for reply in replies])
    finally:
        if held is not None:
            held.end_task()
    return True
