"""The calling thread as a pool's worker: ``num_workers=0``, or a pool resized to none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.parallel.context import enter, leave, take_stages
from naiad.parallel.protocol import (
    ERROR,
    EXHAUSTED,
    OK,
    Exhausted,
    Kind,
    TaskKey,
    add_note,
    add_seconds,
)
from naiad.parallel.worker_side import Handler, WorkerSpec

__all__ = ["InlineWorker"]


class InlineWorker:
    """Runs a pool's handler in the calling thread, as a worker would run it.

    The handler is built once, at the first need, under an inline :class:`WorkerContext`
    (worker 0 of 0). During a call the calling thread is the worker; between the calls of one
    pass its ``worker_rng()`` stream is kept here, so draws go on instead of starting again
    (unless a task has its own seed sequence: NOTE [ Worker randomness ]).

    Args:
        spec: what the handler is built from.
        describe: turns a payload into words for error notes.
        init: call ``worker_init_fn(0)`` when building the handler; False keeps it for real
            workers only, as torch does (a loader whose worker count is tuned starts inline).
        stage_seconds: the pool's running total of stage seconds, which calls add to.
    """

    def __init__(
        self, spec: WorkerSpec, *, describe: Callable[[Any], str], init: bool, stage_seconds: dict[str, float],
    ) -> None:
        self._spec = spec
        self._describe = describe
        self._init = init
        self._stage_seconds = stage_seconds
        self.context = spec.context(0, 0, "inline")
        self._handler: Handler | None = None
        self._rng: np.random.Generator | None = None
        self._rng_key: TaskKey | None = None

    def handler(self) -> Handler:
        """The handler, built at the first call (its set-up's exceptions raise from here)."""
        if self._handler is None:
            previous = enter(self.context, None)
            try:
                self._handler = self._spec.build(self.context, init=self._init)
            finally:
                leave(previous)
        return self._handler

    def call(self, payload: Any, key: TaskKey, entropy: tuple[int, ...] | None = None) -> Any:
        """Run one task of pass ``key`` and return its result; its exception is raised noted
        with the task (:class:`Exhausted` as it is)."""
        handler = self.handler()
        rng = self._rng if self._rng_key == key and entropy is None else None
        previous = enter(self.context, key[1], rng, fresh=rng is None, entropy=entropy)
        try:
            return handler(payload)
        except Exhausted:
            raise
        except Exception as exc:
            add_note(exc, f"naiad: raised in the main process while loading {self._describe(payload)}")
            raise
        finally:
            self._rng, self._rng_key = leave(previous), key
            add_seconds(self._stage_seconds, take_stages())  # parts the handler timed apart (report_stage)

    def answer(self, payload: Any, key: TaskKey, entropy: tuple[int, ...] | None = None) -> tuple[Kind, Any]:
        """:meth:`call` as a worker's answer: ``(Kind.OK, result)``, ``(Kind.EXHAUSTED, None)``
        or ``(Kind.ERROR, the exception)``, which the pass raises in turn (NOTE [ A failed task ])."""
        try:
            return OK, self.call(payload, key, entropy)
        except Exhausted:
            return EXHAUSTED, None
        except Exception as exc:
            return ERROR, exc
