"""DevicePrefetcher on CUDA: the stream protocol keeps every batch's values intact.

See NOTE [ Stream synchronization of prefetched batches ] in naiad/device/prefetch.py. The tests make
the races the protocol prevents likely: large copies (so a consumer that did not wait would read
a half-written batch) and a busy training stream (so a block freed without ``record_stream``
would be overwritten by the next copy while a queued kernel still has to read it).
"""

from __future__ import annotations

import gc
import threading
import time
from collections import namedtuple

import pytest
import torch

from naiad.device.prefetch import DevicePrefetcher
from naiad.telemetry import Telemetry

Pair = namedtuple("Pair", ["x", "y"])

# ~64 MiB per batch: a copy of several milliseconds even over a fast link.
ROWS, COLS = 4096, 4096


def make_batches(n: int) -> list[torch.Tensor]:
    return [torch.full((ROWS, COLS), float(i + 1)) for i in range(n)]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "naiad-prefetch" and t.is_alive()]


def _sleep_cycles(ms: float) -> int:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return int(1_000_000 * ms / max(start.elapsed_time(end), 1e-3))


@pytest.mark.timeout(120)
def test_consumer_stream_waits_for_the_copy():
    batches = make_batches(8)
    checks = []
    for i, b in enumerate(DevicePrefetcher(batches, "cuda", depth=2)):
        assert b.is_cuda
        # Queued at once on the consumer's stream: every element is right only if the stream
        # waited for the copy.
        checks.append((b == float(i + 1)).all())
    torch.cuda.synchronize()
    assert [c.item() for c in checks] == [True] * 8


@pytest.mark.timeout(120)
def test_user_stream_is_the_one_that_waits():
    batches = make_batches(6)
    side = torch.cuda.Stream()
    checks = []
    with torch.cuda.stream(side):
        for i, b in enumerate(DevicePrefetcher(batches, "cuda")):
            checks.append((b == float(i + 1)).all())
    side.synchronize()
    assert [c.item() for c in checks] == [True] * 6


@pytest.mark.timeout(120)
def test_freed_batches_are_not_reused_while_the_step_still_reads_them():
    # The training stream is kept busy, so each sum runs long after its batch was dropped by
    # Python; meanwhile the copy stream copies the next batches. Without record_stream the
    # allocator would give a dropped batch's block to the next copy before the sum read it.
    batches = make_batches(10)
    busy = _sleep_cycles(30.0)
    checks = []
    for i, b in enumerate(DevicePrefetcher(batches, "cuda", depth=3)):
        torch.cuda._sleep(busy)
        checks.append((b == float(i + 1)).all())
        del b
    torch.cuda.synchronize()
    assert [c.item() for c in checks] == [True] * 10


@pytest.mark.timeout(120)
def test_nested_batches_move_every_tensor_and_keep_other_leaves():
    batch = {
        "pair": Pair(torch.ones(3), [torch.zeros(2), "label"]),
        "id": 7,
        "already": torch.ones(2, device="cuda"),
    }
    (out,) = list(DevicePrefetcher([batch], "cuda"))
    assert out["pair"].x.is_cuda and out["pair"].y[0].is_cuda
    assert out["pair"].y[1] == "label" and out["id"] == 7
    assert out["already"] is batch["already"]  # already there: no copy
    assert type(out["pair"]) is Pair


@pytest.mark.timeout(120)
def test_pinned_source_batches_are_copied_as_they_are():
    ds = torch.utils.data.TensorDataset(torch.arange(1000.0).reshape(500, 2))
    loader = torch.utils.data.DataLoader(ds, batch_size=50, pin_memory=True)
    out = [b[0].cpu() for b in DevicePrefetcher(loader, "cuda")]
    assert torch.equal(torch.cat(out), ds.tensors[0])


@pytest.mark.timeout(120)
def test_device_without_index_gets_the_current_device():
    pf = DevicePrefetcher([], "cuda")
    assert pf.device == torch.device("cuda", torch.cuda.current_device())


@pytest.mark.timeout(120)
def test_break_stops_the_thread_and_frees_prefetched_batches():
    def take_two_and_break() -> None:
        for i, _ in enumerate(DevicePrefetcher(make_batches(6), "cuda", depth=3)):
            if i == 1:
                break

    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    take_two_and_break()
    deadline = time.monotonic() + 10
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not prefetch_threads()
    gc.collect()
    torch.cuda.synchronize()
    # Blocks freed after record_stream are returned once their stream events have passed;
    # empty_cache() processes those events.
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() == before


@pytest.mark.timeout(120)
def test_transfer_stage_is_recorded():
    tel = Telemetry()
    list(DevicePrefetcher(make_batches(3), "cuda", telemetry=tel))
    stats = tel.stats()
    assert stats.batches == 3 and stats.rows == 3 * ROWS
    assert stats.stages["transfer"].count == 3


@pytest.mark.timeout(180)
def test_bench_cli_runs_on_cuda(capsys):
    from naiad.cli import main

    argv = [
        "bench",
        "demo",
        "--rows",
        "5000",
        "--batches",
        "20",
        "--step-ms",
        "2",
        "--device",
        "cuda",
    ]
    assert main(argv) == 0
    assert "exposed wait ms/step" in capsys.readouterr().out
