"""Per-process state in one place: what a process keeps for itself (thread pools, open
descriptors, filesystems, caches, locks) made at first use and made again in a forked child.

NOTE [ Per-process state ]
A forked child inherits its parent's memory but none of its threads: a pool's executor there
has no threads behind it, a lock may be held forever by a thread that does not exist, a kept
descriptor is shared with the parent and a filesystem's sockets and event loop are the parent's.
So every such value is a :class:`ProcessLocal`, and one fork hook (``os.register_at_fork``)
forgets them all in the child: each is made again at its first use there. A state's ``on_fork``
releases what the child inherited where its owner would (closing the child's copies of kept
descriptors), and never joins or shuts down a thread pool: the child does not own its threads,
and waiting for them would wait forever. Values that stay true across a fork (a permutation, a
table computed from plain numbers) are no per-process state and stay where they are.

Example:
    >>> import threading
    >>> lock = ProcessLocal(threading.Lock, name="example lock")  # a module's: per_process(name, factory)
    >>> lock.get() is lock.get()
    True
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "per_process", "registered"]

T = TypeVar("T")

_STATES: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()
_NAMED: dict[str, ProcessLocal[Any]] = {}


class ProcessLocal(Generic[T]):
    """A value of this process: made by ``factory()`` at its first :meth:`get`, forgotten in a
    forked child (NOTE [ Per-process state ]), so the child makes its own.

    It pickles as its recipe (the factory, name and ``on_fork``), never its value: a copy in
    another process makes that process's own.

    Args:
        factory: makes the value (called once per process, under :attr:`lock`).
        name: what the state is, for tests and messages (``"naiad.<module> <what>"``).
        on_fork: called in a forked child with the value inherited from the parent, if one was
            made, to release what the child holds of it (close descriptors); it must not join
            threads, take locks or raise.
    """

    def __init__(self, factory: Callable[[], T], *, name: str,
                 on_fork: Callable[[T], None] | None = None) -> None:
        self.factory = factory
        self.name = name
        self.on_fork = on_fork
        self._value: T | None = None
        self._made = False
        self.lock = threading.Lock()
        """Guards the value's making, made again in a forked child: also the lock an owner
        takes around its own changes of the value."""
        _STATES.add(self)

    def get(self) -> T:
        """This process's value, made at the first call."""
        if self._made:
            return self._value  # type: ignore[return-value]
        with self.lock:
            if not self._made:
                self._value, self._made = self.factory(), True
        return self._value

    def peek(self) -> T | None:
        """This process's value if it was made, else None (nothing is made)."""
        return self._value if self._made else None

    def take(self) -> T | None:
        """This process's value, forgotten (the next :meth:`get` makes a new one), or None if
        none was made; call with :attr:`lock` held where another thread may make it meanwhile."""
        value, self._value, self._made = self._value, None, False
        return value

    def _after_fork(self) -> None:
        inherited = self.take() if self._made else None
        self._made = False
        self.lock = threading.Lock()  # another thread of the parent may have held it at the fork
        if inherited is not None and self.on_fork is not None:
            try:
                self.on_fork(inherited)
            except Exception:  # noqa: BLE001 - a child must start even if a release fails
                pass

    def __reduce__(self) -> tuple[Any, ...]:
        return (_remade, (self.factory, self.name, self.on_fork))

    def __repr__(self) -> str:
        return f"ProcessLocal({self.name!r}, {'made' if self._made else 'not made'})"


def _remade(factory: Callable[[], T], name: str, on_fork: Callable[[T], None] | None) -> ProcessLocal[T]:
    return ProcessLocal(factory, name=name, on_fork=on_fork)


def per_process(name: str, factory: Callable[[], T], *,
                on_fork: Callable[[T], None] | None = None) -> ProcessLocal[T]:
    """A module's per-process state, registered once by ``name`` (NOTE [ Per-process state ]).

    Args:
        name: the state's name, unique in the package (a module made again replaces its own).
        factory: makes the value in each process.
        on_fork: releases what a forked child inherited of the value (see :class:`ProcessLocal`).
    """
    state = ProcessLocal(factory, name=name, on_fork=on_fork)
    _NAMED[name] = state
    return state


def registered() -> dict[str, ProcessLocal[Any]]:
    """The modules' per-process states by name (those of objects, like a mixture's lock, are
    anonymous and not listed)."""
    return dict(_NAMED)


def _after_fork_in_child() -> None:
    # The child runs this before anything else of its own: one thread, nothing to race with.
    for state in list(_STATES):
        state._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX: no fork elsewhere
    os.register_at_fork(after_in_child=_after_fork_in_child)
