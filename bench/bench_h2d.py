"""How fast do batches reach the GPU, and how much of the copy does the training loop see?

Three questions, on one CUDA device:

1. **Ceiling**: host-to-device copy throughput from pinned memory (``copy_`` with
   ``non_blocking=True``, timed with CUDA events), and from pageable memory for contrast.
2. **DevicePrefetcher throughput**: batches from pageable memory (pinned by the prefetcher's
   thread, then copied on its stream) and from already-pinned memory (a DataLoader with
   ``pin_memory=True``), against the ceiling, with a consumer that does nothing.
3. **Exposed copy time**: a training step of ``--step-ms`` of GPU work that reads the batch;
   the plain loop (``batch.to("cuda")`` then the step) against DevicePrefetcher. The exposed
   copy time is what the loop waits before it can queue its step.

Without CUDA it prints why and exits 0. Run: ``python bench/bench_h2d.py [--batch-mb 64]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from naiad.cli.steps import cuda_cycles_per_ms
from naiad.device.prefetch import DevicePrefetcher


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def copy_throughput(src: torch.Tensor, dst: torch.Tensor, copies: int, repeats: int) -> float:
    """Median GB/s of ``copies`` back-to-back ``dst.copy_(src, non_blocking=True)``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(copies):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        samples.append(
            gbps(src.numel() * src.element_size() * copies, start.elapsed_time(end) / 1e3)
        )
    return statistics.median(samples)


def prefetch_throughput(batches: Iterable[torch.Tensor], nbytes: int, repeats: int) -> float:
    """Median GB/s through DevicePrefetcher with a consumer that only takes the batches."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 0
        for _ in DevicePrefetcher(batches, "cuda", depth=2):
            n += 1
        torch.cuda.synchronize()
        samples.append(gbps(nbytes * n, time.perf_counter() - t0))
    return statistics.median(samples)


def exposed_copy(
    make_iter: Callable[[], Iterable[torch.Tensor]],
    move: Callable[[torch.Tensor], torch.Tensor] | None,
    step_cycles: int,
    repeats: int,
) -> tuple[float, float]:
    """(ms per step, exposed ms per step): median over repeats of a loop over all batches."""
    per_step, exposed = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        waits, n = 0.0, 0
        t_start = time.perf_counter()
        it = iter(make_iter())
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            if move is not None:
                batch = move(batch)
            waits += time.perf_counter() - t0
            batch.sum()  # the step reads its batch ...
            torch.cuda._sleep(step_cycles)  # ... and computes for --step-ms
            torch.cuda.current_stream().synchronize()  # then reads its loss back
            n += 1
        per_step.append((time.perf_counter() - t_start) / n * 1e3)
        exposed.append(waits / n * 1e3)
    return statistics.median(per_step), statistics.median(exposed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-mb", type=float, default=64.0, help="batch size in MB (default 64)"
    )
    parser.add_argument("--batches", type=int, default=24, help="batches per run (default 24)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="GPU step length (default 20)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"bench_h2d: skipped: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)"
        )
        return 0
    sys.path.insert(0, str(Path(__file__).parent))  # the shared environment() of bench_overlap
    from bench_overlap import environment

    print(environment())
    print(f"command: python bench/bench_h2d.py {' '.join(sys.argv[1:])}\n")
    numel = int(args.batch_mb * 1e6 / 4)
    nbytes = numel * 4
    pageable = torch.rand(numel)
    pinned = pageable.pin_memory()
    dst = torch.empty(numel, device="cuda")

    ceiling = copy_throughput(pinned, dst, 8, args.repeats)
    from_pageable = copy_throughput(pageable, dst, 8, args.repeats)
    print(
        f"{'host-to-device copy, ' + format(args.batch_mb, 'g') + ' MB batches':<46}{'GB/s':>8}{'of ceiling':>12}"
    )
    print(f"{'pinned copy_ (the ceiling)':<46}{ceiling:>8.2f}{1.0:>12.0%}")
    print(f"{'pageable copy_':<46}{from_pageable:>8.2f}{from_pageable / ceiling:>12.0%}")

    # Distinct batches, so no copy is served from a cache the previous one warmed.
    pageable_batches = [torch.rand(numel) for _ in range(args.batches)]
    pinned_batches = [b.pin_memory() for b in pageable_batches]
    pf_pageable = prefetch_throughput(pageable_batches, nbytes, args.repeats)
    pf_pinned = prefetch_throughput(pinned_batches, nbytes, args.repeats)
    print(
        f"{'DevicePrefetcher, pageable source (pins)':<46}{pf_pageable:>8.2f}{pf_pageable / ceiling:>12.0%}"
    )
    print(f"{'DevicePrefetcher, pinned source':<46}{pf_pinned:>8.2f}{pf_pinned / ceiling:>12.0%}")

    step_cycles = int(args.step_ms * cuda_cycles_per_ms(torch.device("cuda")))
    plain = exposed_copy(
        lambda: pageable_batches, lambda b: b.to("cuda"), step_cycles, args.repeats
    )
    plain_pinned = exposed_copy(
        lambda: pinned_batches, lambda b: b.to("cuda", non_blocking=True), step_cycles, args.repeats
    )
    ours = exposed_copy(
        lambda: DevicePrefetcher(pageable_batches, "cuda"), None, step_cycles, args.repeats
    )
    ours_pinned = exposed_copy(
        lambda: DevicePrefetcher(pinned_batches, "cuda"), None, step_cycles, args.repeats
    )
    copy_ms = nbytes / (ceiling * 1e9) * 1e3
    print(
        f"\nstep {args.step_ms:g} ms of GPU work; one batch's copy at the ceiling: {copy_ms:.2f} ms"
    )
    print(f"{'loop':<46}{'ms/step':>9}{'exposed ms':>12}")
    for name, (per_step, exposed) in [
        ("plain: .to('cuda') from pageable, then step", plain),
        ("plain: .to('cuda', non_blocking) from pinned", plain_pinned),
        ("DevicePrefetcher, pageable source", ours),
        ("DevicePrefetcher, pinned source", ours_pinned),
    ]:
        print(f"{name:<46}{per_step:>9.2f}{exposed:>12.3f}")
    print(
        "\nexposed: time the loop waited before it could queue its step. With a non-blocking copy "
        "from pinned memory the plain loop's wait is small, but its step then waits on the GPU "
        "for the copy (ms/step); the prefetcher's copy runs under the previous step."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
