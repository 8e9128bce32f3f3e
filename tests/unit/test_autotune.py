"""AutoTuner's decisions, from synthetic timings (no processes, no clocks that matter)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.errors import ConfigError
from naiad.parallel import AutoTuner, TunerDecision
from naiad.parallel.read_ahead import ReadAheadTuner

Timing = Callable[[int, int], tuple[float, float]]


def pipeline(build_s: float, step_s: float, *, cores: int = 8, transfer_s: float = 100e-6) -> Timing:
    """A loop whose batches cost ``build_s`` of one core each and whose step takes ``step_s``.

    Inline the loop waits ``build_s`` per step. With ``w`` workers it runs at the slower of the
    consumer (step + hand-over) and the producers (``min(w, cores)`` batches per ``build_s``).
    """

    def timing(workers: int, prefetch: int) -> tuple[float, float]:
        if workers == 0:
            return build_s, step_s
        per_step = max(step_s + transfer_s, build_s / min(workers, cores))
        return per_step - step_s, step_s

    return timing


def run(tuner: AutoTuner, timing: Timing, steps: int = 5000) -> list[TunerDecision]:
    changes = []
    for _ in range(steps):
        d = tuner.decision
        change = tuner.observe(*timing(d.num_workers, d.prefetch))
        if change is not None:
            changes.append(change)
        if tuner.settled:
            break
    return changes


def tuner(**kw: Any) -> AutoTuner:
    kw.setdefault("min_window_s", 0.0)
    return AutoTuner(**kw)


def test_cheap_batches_stay_inline() -> None:
    t = tuner(max_workers=8)
    run(t, pipeline(build_s=5e-6, step_s=1e-3))
    d = t.decision
    assert d.settled and d.num_workers == 0
    assert "nothing to gain" in d.reason
    assert [x["num_workers"] for x in t.stats()["trials"]] == [0]


def test_batches_cheaper_than_a_hand_over_stay_inline_even_when_the_step_is_tiny() -> None:
    # The tutorial's case: an in-memory TensorDataset gathered in microseconds, a tiny model.
    t = tuner(max_workers=8)
    run(t, pipeline(build_s=40e-6, step_s=10e-6))
    assert t.decision.settled and t.decision.num_workers == 0
    assert "handing one over" in t.decision.reason


def test_picks_fewest_workers_that_remove_the_wait() -> None:
    # 4 ms to build, 2 ms of work: 2 workers keep up, 1 does not.
    t = tuner(max_workers=8)
    changes = run(t, pipeline(build_s=4e-3, step_s=2e-3))
    d = t.decision
    assert d.settled and d.num_workers == 2 and d.prefetch == 2
    assert "fewest that remove the wait" in d.reason
    tried = {x["num_workers"] for x in t.stats()["trials"]}
    assert tried == {0, 1, 2}  # predicted 2 from the inline window, then checked that 1 is not enough
    assert changes[0].num_workers == 2 and not changes[0].settled


def test_steps_down_while_fewer_workers_still_remove_the_wait() -> None:
    # Predicted 6 workers from a noisy inline window... the real need is 3.
    t = tuner(max_workers=8)
    timing = pipeline(build_s=6e-3, step_s=2e-3)

    def noisy_inline(w: int, p: int) -> tuple[float, float]:
        return (12e-3, 2e-3) if w == 0 else timing(w, p)

    run(t, noisy_inline)
    assert t.decision.num_workers == 3
    assert {x["num_workers"] for x in t.stats()["trials"]} == {0, 2, 3, 4, 5, 6}


def test_loading_bound_uses_every_core_and_says_so() -> None:
    # A CPU-heavy dataset and a near-instant step on 2 cores: more workers always help, the wait stays.
    t = tuner(max_workers=2)
    run(t, pipeline(build_s=2e-3, step_s=1e-6, cores=2))
    d = t.decision
    assert d.settled and d.num_workers == 2
    assert "bottleneck" in d.reason
    # The still-waiting setting got one try at a deeper prefetch, which did not help.
    assert (2, 4) in t.trials and d.prefetch == 2 and "did not help" in d.reason


def test_more_workers_than_cores_are_not_chosen() -> None:
    # 3 ms to build, 1 ms of work, but 2 cores: 3 workers cannot beat 2.
    t = tuner(max_workers=4)
    run(t, pipeline(build_s=3e-3, step_s=1e-3, cores=2))
    assert t.decision.num_workers == 2


def test_deeper_prefetch_is_kept_when_it_pays() -> None:
    t = tuner(max_workers=2)

    def jittery(w: int, p: int) -> tuple[float, float]:
        if w < 2:
            return (3e-3 if w == 0 else 2e-3), 1e-3
        return (0.0, 1e-3) if p >= 4 else (0.4e-3, 1e-3)  # uneven batches: depth absorbs them

    run(t, jittery)
    assert t.decision.settled and (t.decision.num_workers, t.decision.prefetch) == (2, 4)


def test_observe_returns_only_changes_and_the_final_decision() -> None:
    t = tuner(max_workers=8, min_steps=4, warmup_steps=0)
    changes = run(t, pipeline(build_s=4e-3, step_s=2e-3))
    assert [c.num_workers for c in changes] == [2, 1, 2]
    assert changes[-1].settled and not any(c.settled for c in changes[:-1])
    assert t.observe(0.0, 1e-3) is None  # settled: nothing more
    assert t.stats()["since_settled"]["steps"] == 1


def test_warmup_steps_are_not_measured() -> None:
    t = tuner(max_workers=8, min_steps=4, warmup_steps=5)
    for _ in range(5):
        t.observe(1.0, 1.0)  # start-up: huge and ignored
    for _ in range(4):
        t.observe(1e-6, 1e-3)
    assert t.decision.settled and t.stats()["trials"][0]["wait_per_step_s"] == pytest.approx(1e-6)


def test_slow_steps_close_a_window_after_max_window_s() -> None:
    t = tuner(max_workers=8, min_steps=100, max_window_s=3.0, warmup_steps=0)
    t.observe(1e-6, 2.0)
    assert not t.settled
    t.observe(1e-6, 2.0)
    assert t.settled and t.decision.num_workers == 0


def test_max_workers_zero_never_leaves_inline() -> None:
    t = tuner(max_workers=0)
    run(t, pipeline(build_s=5e-3, step_s=1e-3))
    assert t.decision.settled and t.decision.num_workers == 0


def test_stats_are_json_able() -> None:
    import json

    t = tuner(max_workers=8)
    run(t, pipeline(build_s=4e-3, step_s=2e-3))
    s = json.loads(json.dumps(t.stats()))
    assert s["num_workers"] == 2 and s["settled"] and s["reason"] and len(s["trials"]) == 3


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_workers=-1), dict(prefetch=0), dict(target_wait_fraction=0.0), dict(target_wait_fraction=1.5)],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AutoTuner(**kwargs)


class FakePool:
    """Stands for a WorkerPool: records resizes, always ready."""

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int | None]] = []
        self.workers_ready = True

    def resize(self, num_workers: int, *, prefetch: int | None = None) -> None:
        self.sizes.append((num_workers, prefetch))


def test_drive_yields_every_batch_and_resizes_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import naiad.parallel.autotune as autotune

    # A clock that advances 4 ms while the loop waits and 2 ms while it works.
    clock = [0.0]
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: clock[0])
    pool = FakePool()
    t = tuner(max_workers=8, min_steps=4, warmup_steps=0)

    def batches() -> Iterator[int]:
        for i in range(100):
            w = t.decision.num_workers
            clock[0] += 4e-3 / max(1, w) if w < 2 else 0.0
            yield i

    got = []
    for b in t.drive(pool, batches()):
        got.append(b)
        clock[0] += 2e-3
    assert got == list(range(100))
    assert pool.sizes[0] == (0, 2)  # the pool is put in the starting setting
    assert pool.sizes[-1] == (2, 2) and t.decision.settled


@settings(max_examples=200, deadline=None)
@given(
    build_ms=st.floats(0.3, 20.0),
    step_ms=st.floats(0.001, 20.0),
    cores=st.integers(1, 8),
    max_workers=st.integers(0, 8),
)
def test_settles_near_the_best_setting_of_any_pipeline(build_ms: float, step_ms: float, cores: int, max_workers: int) -> None:
    timing = pipeline(build_s=build_ms / 1e3, step_s=step_ms / 1e3, cores=cores)
    t = tuner(max_workers=max_workers)
    run(t, timing)
    d = t.decision
    assert d.settled and 0 <= d.num_workers <= max_workers and d.reason

    def throughput(w: int) -> float:
        return 1.0 / sum(timing(w, 2))

    best = max(throughput(w) for w in range(max_workers + 1))
    assert throughput(d.num_workers) >= (1 - 2 * t.tolerance) * best
    # No setting with fewer workers would have been as fast: the choice is the cheapest.
    assert all(throughput(w) < (1 - t.tolerance) * throughput(d.num_workers) for w in range(d.num_workers) if (w, 2) in t.trials)


class FakeProcess:
    """Wall clock and CPU clocks that a test advances: ``run(seconds, rest_cores, reads_cores)``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0
        self.reads = 0.0

    def run(self, seconds: float, rest_cores: float, reads_cores: float) -> None:
        self.now += seconds
        self.reads += seconds * reads_cores
        self.cpu += seconds * (rest_cores + reads_cores)


def drive_read_ahead(rest_cores: float, reads_cores: float, steps: int = 400, cores: int = 2) -> tuple[ReadAheadTuner, list[TunerDecision]]:
    proc = FakeProcess()
    tuner = ReadAheadTuner(2, batches_per_read=64, cores=cores, reads_cpu=lambda: proc.reads,
                           clock=lambda: proc.now, process_cpu=lambda: proc.cpu)
    changes = []
    for _ in range(steps):
        proc.run(0.004, rest_cores, reads_cores)  # a 4 ms step and its wait
        change = tuner.observe(0.001, 0.003)
        if change is not None:
            changes.append(change)
    return tuner, changes


@pytest.mark.parametrize(("rest", "reads", "threads"), [
    (0.4, 1.4, 2),   # an idle loop: the reads use the cores, the loop little
    (1.0, 0.5, 2),   # a step on one core of two: one is free
    (1.75, 0.25, 0),  # torch's threads on both cores: the threads only compete
    (1.5, 0.5, 0),   # at the threshold, cores - 0.5
])
def test_read_ahead_threads_go_only_when_the_rest_of_the_process_fills_the_cores(rest: float, reads: float, threads: int) -> None:
    tuner, changes = drive_read_ahead(rest, reads)
    assert len(changes) == 1 and changes[0].settled and changes[0].num_workers == threads
    assert tuner.decision == changes[0]
    assert f"{rest:.2f}" in changes[0].reason and f"{reads:.2f}" in changes[0].reason
    # Decided once: later steps change nothing, and are counted for stats().
    stats = tuner.stats()
    assert stats["settled"] and stats["since_settled"]["steps"] > 0
    json.dumps(stats)


def test_read_ahead_measures_nothing_until_the_source_is_counted() -> None:
    # A count beside the first reads (NOTE [ Early reads ]) keeps the cores busy: neither the
    # step's nor the reads', so the second before the window starts once it has ended.
    proc = FakeProcess()
    counted = [False]
    tuner = ReadAheadTuner(2, batches_per_read=64, cores=2, reads_cpu=lambda: proc.reads, settled=lambda: counted[0],
                           clock=lambda: proc.now, process_cpu=lambda: proc.cpu)
    for _ in range(500):  # 2 s of steps while the count runs beside them: a busy "rest"
        proc.run(0.004, 1.8, 0.2)
        assert tuner.observe(0.001, 0.003) is None
    counted[0] = True
    decision = None
    steps = 0
    while decision is None:
        proc.run(0.004, 0.4, 1.4)
        decision = tuner.observe(0.001, 0.003)
        steps += 1
    assert decision.num_workers == 2  # the count's busy cores did not count
    assert steps > 250  # a second of steps after the count, then the window


def test_read_ahead_measures_nothing_in_its_first_second_nor_before_a_full_window() -> None:
    proc = FakeProcess()
    tuner = ReadAheadTuner(2, batches_per_read=64, cores=2, reads_cpu=lambda: proc.reads,
                           clock=lambda: proc.now, process_cpu=lambda: proc.cpu)
    assert tuner.observe(0.0, 0.0) is None  # the first step starts the clock
    proc.run(0.95, 2.0, 0.0)  # start-up with a busy rest: not measured
    assert tuner.observe(0.0, 0.95) is None
    proc.run(0.05, 0.2, 1.5)
    assert tuner.observe(0.001, 0.049) is None  # one second in: the window opens here
    steps = 0
    decision = None
    while decision is None:
        proc.run(0.01, 0.2, 1.5)
        decision = tuner.observe(0.001, 0.009)
        steps += 1
    assert steps == 128  # two reads of 64 batches; 1.28 s, past the half second too
    assert decision.num_workers == 2  # the busy start-up did not count
    _, changes = drive_read_ahead(1.75, 0.25, cores=16)
    assert changes[0].num_workers == 2  # 16 cores: the same step leaves most of them free
