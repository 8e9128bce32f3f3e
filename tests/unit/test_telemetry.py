"""Telemetry: stats math, percentiles, the Chrome trace, bounded memory."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.errors import ConfigError
from naiad.telemetry import LoaderStats, Telemetry

REL = 2 ** (1 / 64) - 1 + 1e-12  # the histogram's bound on a percentile's relative error


def nearest_rank(values: list[float], q: float) -> float:
    return float(np.percentile(values, q * 100, method="inverted_cdf"))


def test_empty_stats_are_zeros_and_print():
    stats = Telemetry().stats()
    assert stats == LoaderStats()
    assert stats.wait_fraction == 0.0 and stats.rows_per_s == 0.0
    assert "batches 0" in str(stats)


def test_step_totals_mean_and_max_are_exact():
    tel = Telemetry()
    waits = [0.001, 0.002, 0.003, 0.010]
    for w in waits:
        tel.record_step(w, rows=100)
    s = tel.stats()
    assert s.batches == 4 and s.rows == 400
    assert s.wait.total_s == pytest.approx(0.016)
    assert s.wait.mean_s == pytest.approx(0.004)
    assert s.wait.max_s == 0.010
    assert s.wait.p50_s == pytest.approx(0.002, rel=REL)
    assert s.wait.p99_s == pytest.approx(0.010, rel=REL)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=100.0), min_size=1, max_size=300))
def test_percentiles_are_within_the_histogram_resolution(waits):
    tel = Telemetry(trace_events=0)
    for w in waits:
        tel.record_step(w)
    s = tel.stats()
    for q, got in ((0.5, s.wait.p50_s), (0.9, s.wait.p90_s), (0.99, s.wait.p99_s)):
        assert got == pytest.approx(nearest_rank(waits, q), rel=REL)
    assert s.wait.max_s == max(waits)
    assert s.wait.p50_s <= s.wait.p90_s <= s.wait.p99_s <= s.wait.max_s


def test_many_steps_fold_into_the_same_stats_as_few():
    # Past _FOLD_STEPS, waits are folded into the histogram in batches; the stats must not
    # depend on where the fold boundaries fall, and a snapshot includes the pending waits.
    rng = np.random.default_rng(1)
    waits = list(rng.lognormal(mean=-7.0, sigma=1.5, size=5000))
    waits[1234] = 0.0
    tel = Telemetry(trace_events=0)
    for i, w in enumerate(waits):
        tel.record_step(w, rows=2)
        if i in (999, 1023, 1024, 3000):
            assert tel.stats().batches == i + 1
    s = tel.stats()
    assert s.batches == 5000 and s.rows == 10_000
    assert s.wait.total_s == pytest.approx(sum(waits))
    assert s.wait.max_s == max(waits)
    for q, got in ((0.5, s.wait.p50_s), (0.9, s.wait.p90_s), (0.99, s.wait.p99_s)):
        assert got == pytest.approx(nearest_rank(waits, q), rel=REL)


@pytest.mark.timeout(60)
def test_stats_read_while_another_thread_records_never_double_count():
    tel = Telemetry(trace_events=0)
    done = threading.Event()

    def work() -> None:
        for _ in range(20_000):
            tel.record_step(1e-4)
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    seen = []
    while not done.is_set():
        seen.append(tel.stats().batches)
    thread.join(30)
    assert seen == sorted(seen) and all(b <= 20_000 for b in seen)
    assert tel.stats().batches == 20_000


def test_add_stages_adds_each_stage():
    tel = Telemetry()
    tel.add_stages({"read": 0.5, "parse": 0.25})
    tel.add_stages({"read": 0.5}, count=3)
    s = tel.stats()
    assert (s.stages["read"].seconds, s.stages["read"].count) == (1.0, 4)
    assert (s.stages["parse"].seconds, s.stages["parse"].count) == (0.25, 1)


def test_zero_and_tiny_waits_count_as_no_wait():
    tel = Telemetry()
    for _ in range(10):
        tel.record_step(0.0)
    tel.record_step(1e-9)
    s = tel.stats()
    assert s.batches == 11 and s.wait.p50_s == 0.0 and s.wait.p99_s == 0.0


def test_huge_waits_land_in_the_last_bucket():
    tel = Telemetry()
    tel.record_step(1e9)
    assert tel.stats().wait.p50_s == 1e9


def test_elapsed_runs_from_the_first_wait_to_the_last_step():
    tel = Telemetry()
    tel.record_step(0.5)  # the wait started half a second ago
    s = tel.stats()
    assert s.elapsed_s == pytest.approx(0.5, abs=0.05)
    assert s.wait_fraction == pytest.approx(1.0, abs=0.1)


def test_stages_accumulate_and_list_by_name():
    tel = Telemetry()
    tel.add("zeta", 1.0)
    tel.add("transfer", 0.5, count=2)
    tel.add("read", 0.25)
    tel.add("read", 0.25, count=3)
    with tel.span("collate"):
        pass
    t0 = tel.begin()
    tel.end("collate", t0)
    s = tel.stats()
    assert list(s.stages) == ["collate", "read", "transfer", "zeta"]  # by name
    assert s.stages["read"].seconds == 0.5 and s.stages["read"].count == 4
    assert s.stages["read"].mean_s == 0.125
    assert s.stages["collate"].count == 2


@pytest.mark.timeout(60)
def test_adding_from_many_threads_loses_nothing():
    tel = Telemetry(trace_events=100)

    def work() -> None:
        for _ in range(5000):
            tel.add("parse", 0.001)
            tel.record_step(0.0001, rows=2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s = tel.stats()
    assert s.stages["parse"].count == 20_000
    assert s.stages["parse"].seconds == pytest.approx(20.0)
    assert s.batches == 20_000 and s.rows == 40_000


def test_to_dict_is_json_and_str_is_a_table():
    tel = Telemetry()
    tel.add("read", 0.1, count=2)
    tel.record_step(0.002, rows=32)
    d = json.loads(json.dumps(tel.stats().to_dict()))
    assert d["batches"] == 1 and d["rows"] == 32
    assert d["stages"]["read"] == {"seconds": 0.1, "count": 2, "mean_s": 0.05}
    assert set(d["wait"]) == {"total_s", "mean_s", "p50_s", "p90_s", "p99_s", "max_s"}
    text = str(tel.stats())
    assert "p99" in text and "read" in text and "waiting for data" in text


def test_chrome_trace_is_valid_json_with_one_row_per_track(tmp_path):
    tel = Telemetry()
    with tel.span("collate"):
        pass
    tel.add("parse", 0.003, start_s=tel.begin() - 0.003, track="worker 1")
    tel.add("read", 0.1)  # no start: counted, not drawn
    tel.record_step(0.001, rows=4)
    path = tel.export_chrome_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    boxes = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in boxes) == ["collate", "parse", "wait"]
    for e in boxes:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["dur"] >= 0 and math.isfinite(e["ts"])
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert tracks["training loop"] == 0 and "worker 1" in tracks
    assert {e["tid"] for e in boxes} <= set(tracks.values())
    assert [e["ts"] for e in boxes] == sorted(e["ts"] for e in boxes)
    assert not (tmp_path / "trace.json.tmp").exists()


def test_trace_is_a_ring_buffer_but_totals_count_everything():
    tel = Telemetry(trace_events=10)
    for _ in range(1000):
        tel.record_step(0.001)
    assert len([e for e in tel.trace_events() if e["ph"] == "X"]) == 10
    assert tel.stats().batches == 1000


def test_reset_forgets_everything():
    tel = Telemetry()
    tel.add("read", 1.0)
    tel.record_step(0.1, rows=3)
    tel.reset()
    assert tel.stats() == LoaderStats()
    assert [e for e in tel.trace_events() if e["ph"] == "X"] == []


def test_negative_ring_buffer_raises_config_error():
    with pytest.raises(ConfigError, match="`trace_events` must be >= 0, got -1"):
        Telemetry(trace_events=-1)
