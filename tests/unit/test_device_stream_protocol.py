"""The CUDA stream protocol, checked on the CPU with stand-ins for torch.cuda's streams and events.

NOTE [ Stream synchronization of prefetched batches ] in naiad/device/prefetch.py: the copy is issued on a
side stream and followed by an event; before ``next()`` returns, the consumer's current stream
waits on that event and every copied tensor is marked for use on it (``record_stream``). The
real thing runs in tests/gpu; this test runs everywhere and pins down the order of the calls.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import pytest
import torch

import naiad.device.prefetch as device_mod
from naiad.device.prefetch import PrefetchIterator
from naiad.device.transfer import CudaMover
from naiad.device.tree import count_rows as _count_rows


class FakeStream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.id))


class FakeEvent:
    ids = itertools.count()

    def __init__(self, log: list) -> None:
        self.id, self.log = next(FakeEvent.ids), log

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record", stream.name, self.id))


@pytest.fixture
def fake_cuda(monkeypatch):
    log: list[tuple] = []  # list.append is atomic: both threads write here
    consumer = FakeStream("consumer", log)
    current = threading.local()

    @contextlib.contextmanager
    def stream_ctx(s: FakeStream):
        current.name = s.name
        yield
        current.name = None

    def record_stream(self: torch.Tensor, s: FakeStream) -> None:
        log.append(("record_stream", id(self), s.name))

    real_to = torch.Tensor.to

    def to(self: torch.Tensor, *args, **kwargs):
        # A copy issued while the copy stream is current, non-blocking: what the protocol needs.
        log.append(("copy", getattr(current, "name", None), kwargs.get("non_blocking", False)))
        return real_to(self, *args, **kwargs).clone()

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("copy", log))
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: FakeEvent(log))
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
    monkeypatch.setattr(torch.Tensor, "to", to)
    return log


def make_iterator(batches) -> PrefetchIterator:
    cpu = torch.device("cpu")  # stands for the CUDA device: tensors "move" by a real .to + clone
    return PrefetchIterator(
        iter(batches),
        device=cpu,
        depth=2,
        mover=CudaMover(cpu, pin_memory=False),
        telemetry=None,
        record_steps=False,
        source_stage=None,
        rows_of=_count_rows,
        timeout_s=None,
    )


@pytest.mark.timeout(30)
def test_consumer_waits_on_the_copy_event_and_records_its_stream_before_next_returns(fake_cuda):
    log = fake_cuda
    batches = [{"x": torch.full((2,), float(i)), "y": [torch.ones(1), "tag"]} for i in range(4)]
    it = make_iterator(batches)
    for i in range(4):
        out = next(it)
        assert torch.equal(out["x"], batches[i]["x"]) and out["x"] is not batches[i]["x"]
        assert out["y"][1] == "tag"
        snapshot = list(log)
        # This batch's event, recorded on the copy stream after its copies ...
        records = [e for e in snapshot if e[0] == "record"]
        event_id = records[i][2]
        assert records[i][1] == "copy"
        # ... was waited on by the consumer's stream before next() returned ...
        assert ("wait_event", "consumer", event_id) in snapshot
        assert snapshot.index(("record", "copy", event_id)) < snapshot.index(
            ("wait_event", "consumer", event_id)
        )
        # ... and both of its tensors were marked for use on the consumer's stream.
        for t in (out["x"], out["y"][0]):
            assert ("record_stream", id(t), "consumer") in snapshot
    with pytest.raises(StopIteration):
        next(it)
    copies = [e for e in log if e[0] == "copy"]
    assert len(copies) == 8
    assert all(stream == "copy" and non_blocking for _, stream, non_blocking in copies)


@pytest.mark.timeout(30)
def test_each_batch_gets_its_own_event(fake_cuda):
    list(make_iterator([torch.zeros(1) for _ in range(5)]))
    waited = [e[2] for e in fake_cuda if e[0] == "wait_event"]
    assert len(waited) == len(set(waited)) == 5


def test_the_protocol_note_is_where_the_code_points():
    assert "NOTE [ Stream synchronization of prefetched batches ]" in (device_mod.__doc__ or "")
