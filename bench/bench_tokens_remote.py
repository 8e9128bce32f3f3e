"""Shuffled token windows from an S3-compatible server behind a far link, against the ways a user
reads them otherwise (NOTE [ Remote windows ] in src/naiad/tokens/remote.py).

A ``.bin`` token file (uint16, nanoGPT's layout) of ``--mb`` MB is uploaded to moto's S3 server
(bench_remote.py's, serving range requests), reached through a proxy that adds ``--latency-ms``
to every request (its own subprocess). Each reader makes ``--batches`` shuffled batches of
``--batch`` windows of ``--seq-len`` + 1 tokens, in the training process (no workers):

- naiad: ``naiad.read_tokens(url)`` through ``naiad.DataLoader`` (a batch's windows in few range
  requests, in flight together);
- one request per window: the same windows, each read with its own range request through
  fsspec's ``cat_file`` (what naiad did before, and what a hand-written loader does);
- fsspec file: ``fs.open(url)`` then ``seek`` and ``read`` per window (fsspec's read-ahead cache);
- local: ``naiad.read_tokens`` on the file on local disk (page cache warm), the reference.

    python bench/bench_tokens_remote.py                 # the recorded run: 16 and 64 MB
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "src"))
from bench.bench_remote import start_moto, start_proxy  # noqa: E402
from bench.harness import environment, markdown_table  # noqa: E402


def window_starts(n_tokens: int, seq_len: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_tokens - seq_len - 1, count)


def time_naiad(path: str, options: dict | None, args: argparse.Namespace) -> float:
    import naiad

    ds = naiad.read_tokens(path, seq_len=args.seq_len, storage=options)
    loader = naiad.DataLoader(ds, batch_size=args.batch, shuffle=True, seed=0)
    it = iter(loader)
    next(it)  # the first batch pays for the connection and the plan
    t0 = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    return (time.perf_counter() - t0) / args.batches


def time_per_window(fs, url: str, n_tokens: int, args: argparse.Namespace) -> float:
    starts = window_starts(n_tokens, args.seq_len, args.batch * (args.batches + 1), 1).reshape(args.batches + 1, -1)
    nbytes = (args.seq_len + 1) * 2

    def batch(row: np.ndarray) -> np.ndarray:
        return np.stack([np.frombuffer(fs.cat_file(url, start=int(s) * 2, end=int(s) * 2 + nbytes), np.uint16) for s in row])

    batch(starts[0])
    t0 = time.perf_counter()
    for row in starts[1:]:
        batch(row)
    return (time.perf_counter() - t0) / args.batches


def time_fsspec_file(fs, url: str, n_tokens: int, args: argparse.Namespace) -> float:
    starts = window_starts(n_tokens, args.seq_len, args.batch * (args.batches + 1), 2).reshape(args.batches + 1, -1)
    nbytes = (args.seq_len + 1) * 2
    with fs.open(url, "rb") as f:
        def batch(row: np.ndarray) -> np.ndarray:
            out = []
            for s in row:
                f.seek(int(s) * 2)
                out.append(np.frombuffer(f.read(nbytes), np.uint16))
            return np.stack(out)

        batch(starts[0])
        t0 = time.perf_counter()
        for row in starts[1:]:
            batch(row)
    return (time.perf_counter() - t0) / args.batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=8)
    args = ap.parse_args()

    import s3fs

    from tests.s3server import BUCKET, S3Server

    moto, endpoint = start_moto()
    proxy, slow = start_proxy(int(endpoint.rsplit(":", 1)[1]), args.latency_ms / 1000)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for mb in args.mb:
                n_tokens = mb * 1_000_000 // 2
                path = os.path.join(d, f"tokens-{mb}.bin")
                np.memmap(path, np.uint16, "w+", shape=(n_tokens,))[:] = np.arange(n_tokens) % 50257
                key = f"bench/tokens-{mb}.bin"
                with open(path, "rb") as f:
                    S3Server.client_for(endpoint).put_object(Bucket=BUCKET, Key=key, Body=f.read())
                url = f"s3://{BUCKET}/{key}"
                opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": slow, "region_name": "us-east-1"}}
                fs = s3fs.S3FileSystem(**opts)
                local = time_naiad(path, None, args)
                naiad_s = time_naiad(url, opts, args)
                per_window = time_per_window(fs, url, n_tokens, args)
                file_s = time_fsspec_file(fs, url, n_tokens, args)
                tokens = args.batch * args.seq_len
                rows.append([f"{mb} MB", f"{tokens / naiad_s / 1e6:.2f}", f"{tokens / per_window / 1e6:.3f}",
                             f"{tokens / file_s / 1e6:.3f}", f"{tokens / local / 1e6:.0f}",
                             f"{per_window / naiad_s:.1f}x", f"{file_s / naiad_s:.1f}x", f"{local / naiad_s:.3f}x"])
                print(rows[-1], flush=True)
    finally:
        proxy.kill()
        moto.kill()
    print(environment())
    print(f"\nShuffled token windows, {args.batch} x {args.seq_len + 1} tokens a batch, +{args.latency_ms:g} ms a "
          f"request, {args.batches} batches after the first (M tokens/s; ratios: naiad's rate over the other's)\n")
    print(markdown_table(["file", "naiad", "one request per window", "fsspec file", "local naiad",
                          "naiad / per window", "naiad / fsspec file", "naiad / local"], rows))


if __name__ == "__main__":
    main()
