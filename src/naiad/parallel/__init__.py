"""Parallel execution: where naiad starts its worker processes and worker threads (the few other
threads it starts, and why, are listed in docs/WORKERS.md, "Threads, processes and waits").

A :class:`WorkerPool` runs a *handler* over a stream of tasks and yields the results in task order
(or as completed). The handler is built inside each worker by a picklable *factory*, so the
dataset (or a source description) crosses the process boundary once and heavy state can be built
in the worker. ``num_workers=0`` runs the handler inline in the calling thread.
"""

from __future__ import annotations

from naiad.parallel.autotune import AutoTuner, TunerDecision
from naiad.parallel.pool import (
    DeferredResults,
    Exhausted,
    HandlerFactory,
    Pinned,
    PoolResults,
    WorkerContext,
    WorkerPool,
    get_worker_context,
    worker_rng,
)
from naiad.parallel.restart import RestartBudget

__all__ = [
    "AutoTuner",
    "DeferredResults",
    "Exhausted",
    "HandlerFactory",
    "Pinned",
    "PoolResults",
    "RestartBudget",
    "TunerDecision",
    "WorkerContext",
    "WorkerPool",
    "get_worker_context",
    "worker_rng",
]
