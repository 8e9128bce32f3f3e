"""What a pass delivered out of order (NOTE [ Out-of-order delivery ]): the runs of plan batches
are the set delivered, and a log gives the set after any number of deliveries the loop received."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from naiad.errors import ConfigError
from naiad.order.delivered import GIVE_BACK, BatchRuns, DeliveryLog, WorkerCounts


@given(st.permutations(list(range(40))), st.integers(0, 40))
def test_batch_runs_hold_exactly_the_batches_added(order: list[int], k: int) -> None:
    runs = BatchRuns()
    for n in order[:k]:
        runs.add(n)
    held = set(order[:k])
    assert len(runs) == len(held)
    assert sorted(set(range(40)) - held) == list(runs.missing(0, 40))
    prefix = next(i for i in range(41) if i not in held)
    assert runs.prefix == prefix
    # Sorted, apart, after the prefix: the form a state stores and reads back.
    beyond = runs.beyond()
    assert all(a < b for a, b in beyond) and all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(beyond))
    assert all(a > prefix for a, _ in beyond)
    assert BatchRuns.of(prefix, beyond).runs == runs.runs


def test_a_batch_added_twice_is_an_error() -> None:
    runs = BatchRuns.of(3, [[5, 7]])
    with pytest.raises(ValueError, match="batch 6 was delivered twice"):
        runs.add(6)


@given(st.permutations(list(range(20))), st.data())
def test_a_log_gives_the_set_after_any_received_count(order: list[int], data: st.DataObject) -> None:
    log = DeliveryLog(BatchRuns.of(0, []))
    received = 0
    for i, n in enumerate(order):
        log.add(n)
        if data.draw(st.booleans()):  # the loop receives some of what was delivered
            received = data.draw(st.integers(received, i + 1))
            log.settle(received)
        # Any count from GIVE_BACK before the received one on (state_dict(pending=k)).
        k = data.draw(st.integers(max(0, received - GIVE_BACK), i + 1))
        assert sorted(set(range(20)) - set(order[:k])) == list(log.at(k).missing(0, 20))
    with pytest.raises(ConfigError, match="is not kept"):
        log.at(received - GIVE_BACK - 1) if received > GIVE_BACK else log.at(len(order) + 1)


def test_worker_counts_count_each_workers_batches() -> None:
    log = DeliveryLog(WorkerCounts([0, 2]))
    for w in (1, 0, 1):
        log.add(w)
    log.settle(1)
    assert log.at(1).counts == [0, 3] and log.at(3).counts == [1, 4]
