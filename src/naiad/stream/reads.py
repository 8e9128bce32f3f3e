"""The worker side of a stream: what a worker does with one task of a plan.

A task (a block range, a read group, a resume's scattered rows) becomes its rows as NumPy
columns and the rows it skipped; the handler is built inside each worker from a picklable
factory (NOTE [ Worker protocol ]).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from naiad.parallel import HandlerFactory, WorkerContext
from naiad.sources.base import Source
from naiad.stream.plan import GroupTask, RestoreTask, Task

__all__ = ["make_handler_factory", "read_task"]


def make_handler_factory(source: Source) -> HandlerFactory:
    """A picklable factory that builds, in each worker, ``handler(ReadTask) -> (columns, bad)``
    (``bad``: the skipped rows, as in :attr:`BlockData.bad`).

    ``columns`` is a plain dict of NumPy arrays (numeric; they cross processes through shared
    memory) and lists (strings and other values).
    """
    return functools.partial(_build_handler, source)


def _build_handler(source: Source, context: WorkerContext) -> Callable[[Any], tuple[dict[str, Any], list[dict[str, Any]]]]:
    if context.mode == "process":
        # Arrow hands out read-only NumPy views; the pool copies them into shared memory, so
        # torch's warning about non-writable arrays is noise there.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        source.keep_nothing()  # this worker's own copy (NOTE [ Kept blocks ])
    # Inline there is no other worker, so PyArrow may use its own threads on a block.
    return functools.partial(read_task, source, context.num_workers == 0)


def read_task(source: Source, use_threads: bool, task: Task | RestoreTask) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What a worker does with one task of a plan: its rows as columns, and the rows it skipped."""
    if isinstance(task, RestoreTask):  # a resume's window: only the rows it restores
        data = source.read_rows_many([(t.block, t.row_numbers()) for t in task.reads], use_threads=use_threads)
    elif isinstance(task, GroupTask):  # consecutive small reads, in one go (NOTE [ Read groups ])
        data = source.read_group([(t.block, t.lo, t.hi, t.take) for t in task.reads], use_threads=use_threads)
    elif task.take is None:
        data = source.read_block(task.block, task.lo, task.hi, use_threads=use_threads)
    else:  # the scattered rows an elastic leg owes
        data = source.read_rows(task.block, task.row_numbers(), use_threads=use_threads)
    return dict(data.columns), list(data.bad)  # plain dict, list and tuple: WorkerPool looks inside
