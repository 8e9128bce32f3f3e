"""DevicePrefetcher on the CPU: order, nesting, bounds, errors and shutdown."""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.device.prefetch import DevicePrefetcher
from naiad.device.transfer import Mover, move_to_device
from naiad.device.tree import count_rows as _count_rows
from naiad.errors import ConfigError, WorkerError
from naiad.telemetry import Telemetry

Pair = namedtuple("Pair", ["x", "y"])


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "naiad-prefetch" and t.is_alive()]


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    assert wait_until(lambda: not prefetch_threads()), "a prefetch thread from an earlier test"
    yield
    if prefetch_threads():
        gc.collect()  # slow with torch loaded: only when a thread is still there
    assert wait_until(lambda: not prefetch_threads()), "the test left a prefetch thread running"


class CountingSource:
    """An endless (or ``n``-long) source that counts how many batches were taken from it."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n
        self.taken = 0
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[torch.Tensor]:
        try:
            i = 0
            while self.n is None or i < self.n:
                self.taken += 1
                yield torch.full((4,), float(i))
                i += 1
        finally:
            self.closed.set()


@pytest.mark.timeout(30)
def test_batches_come_in_source_order():
    batches = [torch.arange(3) + 10 * i for i in range(50)]
    out = list(DevicePrefetcher(batches, "cpu", depth=3))
    assert len(out) == 50
    for got, want in zip(out, batches, strict=True):
        assert got is want  # device="cpu": no copy at all


@pytest.mark.timeout(30)
def test_same_batches_as_the_wrapped_torch_dataloader():
    ds = torch.utils.data.TensorDataset(torch.arange(100.0).reshape(50, 2), torch.arange(50))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    ours = list(DevicePrefetcher(loader, "cpu"))
    theirs = list(loader)
    assert len(ours) == len(theirs) == len(loader)
    for (a, b), (c, d) in zip(ours, theirs, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


@pytest.mark.timeout(30)
def test_nested_containers_keep_their_types_and_leaves_pass_through():
    arr = np.arange(3)
    dd: defaultdict[str, list[int]] = defaultdict(list, {"t": torch.ones(1)})
    batch = {
        "pair": Pair(torch.zeros(2), [torch.ones(2), "label", 7]),
        "ordered": OrderedDict([("b", torch.ones(1)), ("a", None)]),
        "default": dd,
        "tuple": (torch.ones(1), 2.5),
        "array": arr,
        "text": "hello",
    }
    (out,) = list(DevicePrefetcher([batch], "cpu"))
    assert type(out["pair"]) is Pair
    assert torch.equal(out["pair"].x, torch.zeros(2))
    assert out["pair"].y[1:] == ["label", 7]
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert type(out["default"]) is defaultdict and out["default"].default_factory is list
    assert type(out["tuple"]) is tuple and out["tuple"][1] == 2.5
    assert out["array"] is arr
    assert out["text"] == "hello"


@settings(max_examples=50, deadline=None)
@given(
    st.recursive(
        st.one_of(
            st.integers(), st.text(max_size=3), st.none(), st.builds(torch.randn, st.integers(0, 3))
        ),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.tuples(children, children),
            st.dictionaries(st.text(max_size=2), children, max_size=3),
            st.builds(Pair, children, children),
        ),
        max_leaves=10,
    )
)
def test_cpu_mover_rebuilds_an_equal_structure_around_the_same_tensors(batch):
    out, event, copied, foreign = Mover(torch.device("cpu"))(batch)
    assert _structure(out) == _structure(batch)
    assert event is None and copied == [] and not foreign


def _structure(obj):
    if isinstance(obj, torch.Tensor):
        return ("tensor", id(obj))
    if isinstance(obj, dict):
        return (type(obj), {k: _structure(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return (type(obj), [_structure(v) for v in obj])
    return obj


def test_rows_are_the_length_of_the_first_array_leaf():
    assert _count_rows((torch.zeros(5, 2), torch.zeros(3))) == 5
    assert _count_rows({"name": "x", "a": np.zeros((7, 1))}) == 7
    assert _count_rows(torch.tensor(1.0)) == 1
    assert _count_rows(["a", 1]) is None
    # A text column (read_text's batches): one string a row, counted without a walk over them.
    assert _count_rows({"text": ["a", "b", "c"]}) == 3
    assert _count_rows({"text": [b"a", b"b"], "n": torch.zeros(2)}) == 2


def test_move_to_device_walks_containers():
    out = move_to_device(Pair(torch.ones(1), "s"), "cpu")
    assert type(out) is Pair and out.y == "s"


def waiting_for_a_slot(thread: threading.Thread) -> bool:
    """True while ``thread`` (a prefetch thread) waits for the consumer to free a slot: its
    innermost frames are a semaphore's ``acquire`` called from the producer's wait for a slot."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "acquire" in names[:3] and "_slot_free" in names


@pytest.mark.timeout(30)
def test_depth_bounds_the_batches_taken_ahead_of_the_consumer():
    # Not "sleep, then see that nothing more was taken" (which passes whenever the thread is
    # slow): wait until the thread is seen blocked for a slot, then count what it took.
    source = CountingSource()
    it = iter(DevicePrefetcher(source, "cpu", depth=3))
    (thread,) = prefetch_threads()
    assert wait_until(lambda: source.taken >= 3 and waiting_for_a_slot(thread))
    assert source.taken == 3
    next(it)
    assert wait_until(lambda: source.taken >= 4 and waiting_for_a_slot(thread))
    assert source.taken == 4
    it.close()


@pytest.mark.timeout(30)
def test_break_stops_the_thread_and_closes_the_source():
    source = CountingSource()
    for i, _ in enumerate(DevicePrefetcher(source, "cpu")):
        if i == 5:
            break
    # The for loop dropped its iterator: the finalizer has joined the thread already.
    assert not prefetch_threads()
    assert source.closed.wait(5)


@pytest.mark.timeout(30)
def test_exception_in_the_training_loop_stops_the_thread():
    source = CountingSource()

    def train() -> None:
        for i, _ in enumerate(DevicePrefetcher(source, "cpu")):
            if i == 3:
                raise RuntimeError("loss is nan")

    with pytest.raises(RuntimeError, match="loss is nan"):
        train()
    gc.collect()  # the traceback held the frame that held the iterator
    assert wait_until(lambda: not prefetch_threads())
    assert source.closed.wait(5)


@pytest.mark.timeout(30)
def test_garbage_collected_iterator_stops_its_thread():
    source = CountingSource()
    it = iter(DevicePrefetcher(source, "cpu"))
    next(it)
    assert it.alive
    del it
    assert wait_until(lambda: not prefetch_threads())
    assert source.closed.wait(5)


@pytest.mark.timeout(30)
def test_close_and_context_manager_stop_the_thread():
    with iter(DevicePrefetcher(CountingSource(), "cpu")) as it:
        next(it)
    assert not it.alive
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.timeout(30)
def test_end_of_source_stops_the_thread_and_iterator_stays_exhausted():
    it = iter(DevicePrefetcher(CountingSource(3), "cpu"))
    assert len(list(it)) == 3
    assert not it.alive
    assert list(it) == []


def failing_source() -> Iterator[torch.Tensor]:
    yield torch.zeros(1)
    yield torch.ones(1)
    raise KeyError("column 'label' not found")


@pytest.mark.timeout(30)
def test_source_error_is_reraised_with_its_traceback():
    it = iter(DevicePrefetcher(failing_source(), "cpu"))
    assert torch.equal(next(it), torch.zeros(1))
    assert torch.equal(next(it), torch.ones(1))
    with pytest.raises(KeyError, match="label") as info:
        next(it)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_source" in frames  # the source's own frame, from the background thread
    assert any("batch 2" in note for note in info.value.__notes__)
    assert wait_until(lambda: not it.alive)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.timeout(30)
def test_each_iter_is_a_new_pass_over_the_source():
    pf = DevicePrefetcher([torch.zeros(1), torch.ones(1)], "cpu")
    assert len(list(pf)) == 2
    assert len(list(pf)) == 2


@pytest.mark.timeout(30)
def test_timeout_raises_worker_error_without_waiting_for_the_stuck_source():
    release = threading.Event()

    def stuck() -> Iterator[torch.Tensor]:
        release.wait(20)
        yield torch.zeros(1)

    it = iter(DevicePrefetcher(stuck(), "cpu", timeout_s=0.2))
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="timeout_s=0.2"):
        next(it)
    assert time.monotonic() - t0 < 3.0
    release.set()  # let the stuck thread finish its next() and see the stop flag
    assert wait_until(lambda: not it.alive)


@pytest.mark.timeout(30)
def test_len_follows_the_source():
    assert len(DevicePrefetcher(range(7), "cpu")) == 7
    with iter(DevicePrefetcher(range(7), "cpu")) as it:
        assert len(it) == 7  # as torch's DataLoader iterators: the whole pass
    with pytest.raises(TypeError, match="no len"):
        len(DevicePrefetcher(iter(range(7)), "cpu"))
    with (
        iter(DevicePrefetcher(iter(range(7)), "cpu")) as it,
        pytest.raises(TypeError, match="no len"),
    ):
        len(it)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"depth": 0}, "`depth` must be an int >= 1, got 0"),
        ({"depth": 1.5}, "`depth`"),
        ({"timeout_s": 0}, "`timeout_s` must be > 0"),
        ({"pin_memory": True}, "`pin_memory=True` needs a CUDA"),
        ({"device": "warp-drive"}, "`device` must name a torch device"),
    ],
)
def test_bad_arguments_raise_config_error(kwargs, match):
    args = {"iterable": [], "device": "cpu", **kwargs}
    with pytest.raises(ConfigError, match=match):
        DevicePrefetcher(**args)


def test_not_iterable_raises_config_error():
    with pytest.raises(ConfigError, match="must be iterable"):
        DevicePrefetcher(42, "cpu")  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_raises_config_error():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        DevicePrefetcher([], "cuda")


@pytest.mark.timeout(30)
def test_telemetry_records_steps_transfer_and_source_stage():
    tel = Telemetry()
    batches = [(torch.zeros(8, 2), torch.zeros(8)) for _ in range(5)]
    out = list(DevicePrefetcher(batches, "cpu", telemetry=tel, source_stage="load"))
    stats = tel.stats()
    assert len(out) == stats.batches == 5
    assert stats.rows == 40
    assert stats.stages["transfer"].count == 5
    assert stats.stages["load"].count == 5
    names = {e["name"] for e in tel.trace_events()}
    assert {"wait", "transfer", "load"} <= names


@pytest.mark.timeout(30)
def test_record_steps_false_leaves_steps_to_the_caller():
    tel = Telemetry()
    list(DevicePrefetcher([torch.zeros(2)] * 3, "cpu", telemetry=tel, record_steps=False))
    stats = tel.stats()
    assert stats.batches == 0
    assert stats.stages["transfer"].count == 3


@pytest.mark.timeout(30)
def test_the_source_runs_while_the_consumer_holds_a_batch():
    # Overlap without timing: batch 1 is made while the consumer still holds batch 0.
    making_second = threading.Event()

    def source() -> Iterator[int]:
        yield 0
        making_second.set()
        yield 1

    it = iter(DevicePrefetcher(source(), "cpu"))
    assert next(it) == 0
    assert making_second.wait(5)
    assert next(it) == 1
