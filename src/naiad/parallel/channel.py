"""The training process's end of a process worker's socket: tasks out, never blocking.

NOTE [ Task channel ]
Each process worker shares one Unix socket pair with the training process: results, and the
descriptors of its batch slots, come back on it (NOTE [ Batch transport ]); tasks go out on it.
Tasks used to go through a ``multiprocessing.Queue``, whose feeder thread had to be woken for
every task: on a machine whose cores the workers keep busy, that wake-up (a thread switch and a
contended interpreter lock) was most of the training process's cost per batch (64% of its
interpreter time with 2 workers on 2 cores, for token windows).

A send may never block: a worker blocked sending a result that nobody reads while the training
process blocked sending it a task would hang both. So :meth:`TaskChannel.put` frames a task as
``multiprocessing.connection`` frames a message (the worker reads it with ``Connection.recv``),
appends it to the channel's own buffer and writes what the socket takes without waiting
(``MSG_DONTWAIT``). Whatever is left goes out from :meth:`flush`, which the backend calls each
time it waits for results, waiting on the socket's room too. Tasks are small and a worker holds
a few at a time, so the buffer is almost always empty.

A worker that has gone cannot take tasks: the first failed write marks the channel ``broken``
and later puts are dropped; the backend learns of the death from the worker's sentinel, as
before.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

__all__ = ["TaskChannel"]

# MSG_NOSIGNAL: a worker gone is a BrokenPipeError, not SIGPIPE (Python ignores SIGPIPE anyway;
# macOS has no such flag).
_FLAGS = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)


def frame(obj: Any) -> bytes:
    """``obj`` pickled and framed as ``Connection.send`` frames it (``Connection.recv`` reads it).

    Plain ``pickle``, not multiprocessing's ``ForkingPickler`` (a Python-level pickler, several
    microseconds a task): a task holds indices and plans, which need none of its reducers.
    """
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    if n > 0x7FFFFFFF:
        return struct.pack("!i", -1) + struct.pack("!Q", n) + bytes(data)
    return struct.pack("!i", n) + bytes(data)


class TaskChannel:
    """Sends tasks to one worker over its socket without ever blocking (NOTE [ Task channel ]).

    Args:
        conn: the training process's end of the worker's socket pair (a ``Connection``); the
            channel writes through a duplicate of its descriptor and closes only that.
    """

    def __init__(self, conn: Any) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno()))
        self._out = bytearray()
        self.broken = False

    def put(self, obj: Any) -> None:
        """Queue ``obj`` for the worker and send what the socket takes now."""
        if self.broken:
            return
        self._out += frame(obj)
        self.flush()

    def put_nowait(self, obj: Any) -> None:
        """:meth:`put` (which never waits anyway)."""
        self.put(obj)

    def flush(self) -> bool:
        """Send what is buffered, as far as the socket takes it now; whether all of it went."""
        out = self._out
        while out and not self.broken:
            try:
                sent = self._sock.send(out, _FLAGS)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:  # the worker's end is closed: it has gone
                self.broken = True
                out.clear()
                return True
            del out[:sent]
        return True

    @property
    def pending(self) -> bool:
        """Whether tasks wait in the buffer for room in the socket."""
        return bool(self._out) and not self.broken

    def fileno(self) -> int:
        """The descriptor to wait on for room."""
        return self._sock.fileno()

    def close(self) -> None:
        """Close this channel's descriptor (the connection keeps its own)."""
        self._out.clear()
        self._sock.close()
