"""BadRowLedger and BadRowTracker: bounded, JSON state that leaves out batches cut ahead, skipped
rows kept in place through a stream and dropped at batch assembly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from naiad.errors import SourceError, StateError
from naiad.stream.ledger import BAD_ID, BadRowLedger, BadRowTracker


def _entries(n: int, start: int = 0, reason: str = "bad") -> list[dict]:
    return [{"file": "f.csv", "line": start + i, "reason": reason} for i in range(n)]


def test_ledger_keeps_the_first_entries_and_counts_all() -> None:
    ledger = BadRowLedger(keep=3)
    ledger.record(0, 0, _entries(2))
    ledger.record(0, 4, _entries(4, 10, reason="worse"))
    ledger.record(1, 0, _entries(1, 99))
    assert ledger.total == 7 and len(ledger.entries) == 3
    assert [(e["line"], e["epoch"]) for e in ledger.entries] == [(0, 0), (1, 0), (10, 0)]
    assert ledger.by_file() == {"f.csv": 7}
    assert list(ledger.by_reason().items()) == [("worse", 4), ("bad", 3)]
    assert "7 in all (every epoch), in f.csv (7); the commonest reasons: 'worse' (4); 'bad' (3)" in ledger.summary()


def test_ledger_state_leaves_out_batches_cut_ahead_of_the_position() -> None:
    ledger = BadRowLedger()
    ledger.record(0, 1, _entries(2))
    ledger.record(0, 5, _entries(1, 50))
    ledger.record(0, 6, _entries(4, 60))
    state = ledger.state(epoch=0, batch=5)  # the consumer has batches 0..4
    assert state["total"] == 2 and [e["line"] for e in state["entries"]] == [0, 1]
    assert ledger.state()["total"] == 7
    restored = BadRowLedger()
    restored.load(json.loads(json.dumps(state)))
    assert restored.total == 2 and restored.entries == ledger.entries[:2]


def test_rows_counted_after_later_batches_were_cut_stay_in_a_state_behind_those() -> None:
    # A decode stage counts batch 1's skipped samples after the stream cut batches 2 and 3.
    ledger = BadRowLedger()
    tracker = BadRowTracker(ledger, epoch=0, limit=None, planned_rows=100)
    tracker.count(0, _entries(1, 0))
    tracker.count(3, _entries(2, 30))
    tracker.count(1, _entries(3, 10))
    state = ledger.state(epoch=0, batch=2)  # the consumer has batches 0 and 1
    assert state["total"] == 4 and [e["line"] for e in state["entries"]] == [0, 10, 11, 12]
    assert tracker.skipped_before(2, 0) == 4 and tracker.skipped_before(4, 5) == 11


@pytest.mark.parametrize("bad", [None, {"counts": 3}, {"counts": [["f", "r", -1]], "entries": []},
                                 {"counts": [], "entries": [{"line": 3}]}, {"counts": [["f"]], "entries": []}])
def test_ledger_refuses_a_malformed_state(bad: object) -> None:
    with pytest.raises(StateError, match="bad_row_ledger"):
        BadRowLedger().load(bad)


def test_tracker_keeps_positions_then_drops_placeholders_into_the_ledger() -> None:
    ledger = BadRowLedger()
    tracker = BadRowTracker(ledger, epoch=2, limit=None, planned_rows=6)
    good = {"x": np.array([10.0, 12.0, 13.0, 15.0]), "s": np.array(["a", "c", "d", "f"], object)}
    bad = [{"at": 1, "file": "f", "line": 2, "reason": "r"}, {"at": 4, "file": "f", "line": 5, "reason": "r"}]
    tagged = tracker.tag(good, bad)
    assert tagged[BAD_ID].tolist() == [-1, 0, -1, -1, 1, -1]
    assert tagged["x"].tolist() == [10.0, 0.0, 12.0, 13.0, 0.0, 15.0]
    assert tagged["s"].tolist() == ["a", None, "c", "d", None, "f"]
    # The shuffle buffer moves rows; a batch of positions 5, 1, 0 keeps the good ones in order.
    order = np.array([5, 1, 0])
    batch = tracker.untag({k: v[order] for k, v in tagged.items()}, index=0)
    assert set(batch) == {"x", "s"} and batch["x"].tolist() == [15.0, 10.0]
    assert [e["line"] for e in ledger.entries] == [2] and tracker.skipped == 1
    assert tracker.skipped_before(0, 0) == 0 and tracker.skipped_before(1, 0) == 1


def test_tracker_raises_past_max_bad_rows_with_a_summary() -> None:
    tracker = BadRowTracker(BadRowLedger(), epoch=0, limit=0.25, planned_rows=8)  # at most 2
    tagged = tracker.tag({"x": np.arange(5.0)}, [{"at": i, "file": "f.csv", "line": i + 1, "reason": "oops"} for i in (0, 2, 4)])
    with pytest.raises(SourceError, match=r"3 bad rows skipped in epoch 0, past max_bad_rows=0.25 of 8 rows.*'oops' \(3\)"):
        tracker.untag(tagged, index=0)
