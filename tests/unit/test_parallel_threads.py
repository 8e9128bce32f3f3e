"""run_beside, and the shuffle buffer's use of it: same results, errors surface."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import naiad.stream.shuffle as shuffle_module
from naiad.parallel.threads import run_beside
from naiad.stream.shuffle import ShuffleBuffer


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: both steps run in this thread")
def test_run_beside_runs_both_and_waits_for_the_helper_even_on_an_error() -> None:
    here_thread = threading.current_thread().name
    names: dict[str, str] = {}
    done = threading.Event()

    def there() -> int:
        names["there"] = threading.current_thread().name
        done.wait(5)
        return 2

    def here() -> int:
        names["here"] = threading.current_thread().name
        done.set()
        return 1

    assert run_beside(here, there) == (1, 2)
    assert names["here"] == here_thread and names["there"] != here_thread

    finished = threading.Event()

    def slow_there() -> None:
        finished.wait(0.2)
        finished.set()

    def failing_here() -> None:
        raise ValueError("here")

    with pytest.raises(ValueError, match="here"):
        run_beside(failing_here, slow_there)
    assert finished.is_set()  # the helper finished before the error came back

    def failing_there() -> None:
        raise KeyError("there")

    with pytest.raises(KeyError, match="there"):
        run_beside(lambda: 1, failing_there)


def _shuffle(columns: int, rows: int) -> list[dict[str, np.ndarray]]:
    buf = ShuffleBuffer(20_000, np.random.default_rng(7))
    data = {f"c{i}": np.arange(rows, dtype=np.float32) * (i + 1) for i in range(columns)}
    out = []
    for start in range(0, rows, 30_000):
        out += buf.push({k: v[start : start + 30_000] for k, v in data.items()})
    out.append(buf.flush())
    return out


def test_threaded_exchange_gives_exactly_the_serial_result(monkeypatch: pytest.MonkeyPatch) -> None:
    threaded = _shuffle(10, 200_000)
    monkeypatch.setattr(shuffle_module, "_SPLIT_MIN_VALUES", 1 << 62)
    serial = _shuffle(10, 200_000)
    assert len(threaded) == len(serial)
    for a, b in zip(threaded, serial, strict=True):
        assert list(a) == list(b) == [f"c{i}" for i in range(10)]  # column order kept
        for k in a:
            assert np.array_equal(a[k], b[k])
    ids = np.concatenate([c["c0"] for c in threaded])
    assert sorted(ids.tolist()) == list(range(200_000))
    assert all(np.array_equal(c[f"c{i}"], c["c0"] * (i + 1)) for c in threaded for i in range(10))
