"""The local block cache, read-ahead and the remote block index, against a real S3 server on loopback.

moto's server mode answers on 127.0.0.1; the proxy of tests/s3server.py sits in front of it to
log every request (method, path, Range header), add latency and count the requests in flight.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
from collections import Counter

import pytest

pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")

import naiad  # noqa: E402
from naiad.errors import ConfigError  # noqa: E402
from naiad.sources.cache import block_cache, cache_stats  # noqa: E402
from naiad.sources.retries import RetryPolicy
from naiad.sources.storage import Storage
from tests.conftest_stream import FORMATS  # noqa: E402
from tests.s3server import (  # noqa: E402
    BUCKET,
    S3Server,
    epoch_ids,
    open_numbered_url,
    own_server,
    stop_server,
    upload_numbered,
)

SIZES = [61, 0, 23, 40]
TOTAL = sum(SIZES)
FAST_FAIL = RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01)  # a stopped server fails at once


@pytest.fixture
def server():
    """A server of the test's own, so the test may stop it."""
    yield from own_server()


stop = stop_server


def options(s3: S3Server) -> dict:
    """Through the proxy; the client's own retries off, so a stopped server fails fast."""
    return s3.options(s3.proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})


def upload(s3: S3Server, tmp_path, fmt: str, prefix: str, sizes=SIZES) -> str:
    return upload_numbered(s3, str(tmp_path), fmt, prefix, sizes)


def open_url(url: str, fmt: str, opts: dict, **kw) -> naiad.sources.Source:
    return open_numbered_url(url, fmt, opts, retry=FAST_FAIL, **kw)


def object_gets(s3: S3Server, prefix: str) -> list[str | None]:
    return [r for m, p, r in s3.proxy.requests if m == "GET" and f"/{BUCKET}/{prefix}/" in p]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_second_epoch_reads_the_cache_with_the_server_stopped(server, tmp_path, fmt):
    url = upload(server, tmp_path, fmt, f"offline/{fmt}")
    cache = tmp_path / "cache"
    src = open_url(url, fmt, options(server), cache_dir=cache)
    loader = naiad.DataLoader(src, batch_size=8, shuffle=True, seed=4)
    first = epoch_ids(loader)
    assert sorted(first) == list(range(TOTAL))
    assert cache_stats(cache).misses > 0
    stop(server)
    second = epoch_ids(loader)  # another block order: every block comes from the cache
    assert sorted(second) == list(range(TOTAL)) and second != first


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_exactly_once_across_process_workers_and_ranks_sharing_one_cache(server, tmp_path, fmt):
    url = upload(server, tmp_path, fmt, f"ranks/{fmt}")
    cache = tmp_path / "cache"

    def epoch(epoch_number: int) -> list[list[int]]:
        per_rank = []
        for rank in range(2):
            src = open_url(url, fmt, options(server), cache_dir=cache)
            loader = naiad.DataLoader(src, batch_size=6, shuffle=True, seed=7, shuffle_buffer=20,
                                      num_workers=2, rank=rank, world_size=2)
            loader.set_epoch(epoch_number)
            per_rank.append(epoch_ids(loader))
        return per_rank

    for n in range(2):
        got = epoch(n)
        assert len(got[0]) == len(got[1]) and not set(got[0]) & set(got[1])
        assert sorted(got[0] + got[1]) == list(range(TOTAL))
        if n == 0:
            fetched = Counter(object_gets(server, f"ranks/{fmt}"))
    # Epoch 2 fetched nothing: every range the workers of both ranks read was in the cache.
    assert Counter(object_gets(server, f"ranks/{fmt}")) == fetched


@pytest.mark.timeout(120)
def test_a_changed_object_is_fetched_again_never_mixed_with_the_cached_one(server, tmp_path):
    def body(base: int) -> bytes:  # the same size for both versions: only the ETag differs
        return b"id\n" + b"".join(b"%d\n" % (base + i) for i in range(100))

    url = server.put("changed/a.csv", body(1000))
    cache = tmp_path / "cache"
    src = naiad.read_csv(url, storage=Storage(options(server), cache_dir=cache), block_bytes=64)
    assert sorted(epoch_ids(naiad.DataLoader(src, batch_size=16, shuffle=True, seed=0))) == list(range(1000, 1100))
    server.put("changed/a.csv", body(2000))
    before = cache_stats(cache).misses  # the new version's scan and blocks are misses (fetched)
    again = naiad.read_csv(url, storage=Storage(options(server), cache_dir=cache), block_bytes=64)
    assert again.storage.stat(url).size == src.storage.stat(url).size
    assert again.storage.stat(url).etag != src.storage.stat(url).etag
    assert sorted(epoch_ids(naiad.DataLoader(again, batch_size=16, shuffle=True, seed=0))) == list(range(2000, 2100))
    assert cache_stats(cache).misses > before


@pytest.mark.timeout(120)
def test_eviction_keeps_the_cache_under_cache_bytes(server, tmp_path):
    url = upload(server, tmp_path, "csv", "evict", sizes=[400, 300])  # about 9 KB in 64-byte blocks
    cache = tmp_path / "cache"
    bound = 2000
    src = open_url(url, "csv", options(server), cache_dir=cache, cache_bytes=bound)
    loader = naiad.DataLoader(src, batch_size=32, shuffle=True, seed=1)
    for _ in range(2):
        assert sorted(epoch_ids(loader)) == list(range(700))
        assert block_cache(str(cache), bound).total_bytes() <= bound
    assert cache_stats(cache).evicted > 0


def _read_in_a_process(url: str, opts: dict, cache: str, out: mp.Queue) -> None:
    src = naiad.read_csv(url, storage=Storage(opts, FAST_FAIL, cache_dir=cache), block_bytes=64)
    loader = naiad.DataLoader(src, batch_size=16, shuffle=True, seed=3, read_ahead=4)
    out.put((sorted(epoch_ids(loader)), cache_stats(cache).misses))


def entries(cache) -> int:
    return sum(1 for f in (cache / "blocks").rglob("*") if f.is_file() and not f.name.startswith(".tmp-"))


@pytest.mark.timeout(180)
def test_two_processes_sharing_one_cache_read_correct_data_and_fetch_each_range_once(server, tmp_path):
    url = upload(server, tmp_path, "csv", "shared", sizes=[300, 200])
    cache = tmp_path / "cache"
    opts = options(server)
    len(naiad.read_csv(url, storage=Storage(opts, cache_dir=cache), block_bytes=64))  # the index, once
    shutil.rmtree(cache / "blocks")  # the chunks its scan kept: the two processes fetch them again
    before = cache_stats(cache).misses
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read_in_a_process, args=(url, opts, str(cache), out)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [ids for ids, _ in results] == [list(range(500))] * 2
    # Every entry was fetched by one process only (the other waited for it, or found it).
    assert cache_stats(cache).misses - before + sum(m for _, m in results) == entries(cache)
    assert sum(m for _, m in results) > 0  # the blocks were fetched by the two, not earlier


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_the_blocks_of_a_read_group_are_fetched_concurrently(server, tmp_path, fmt):
    url = upload(server, tmp_path, fmt, f"ahead/{fmt}")
    src = open_url(url, fmt, options(server))
    src.prepare()
    server.proxy.latency_s = 0.05
    # read_ahead=0: one task at a time, so requests overlap only within a read group.
    ids = epoch_ids(naiad.DataLoader(src, batch_size=8, shuffle=True, seed=2, read_ahead=0))
    assert sorted(ids) == list(range(TOTAL))
    assert server.proxy.max_concurrent >= 4


@pytest.mark.timeout(120)
def test_a_new_source_skips_the_scan_of_a_remote_file_with_no_get(server, tmp_path):
    body = b"id,pad\n" + b"".join(b"%d,%s\n" % (i, b"x" * 40) for i in range(40_000))  # 1.8 MB
    url = server.put("indexed/big.csv", body)
    cache = tmp_path / "cache"
    first = naiad.read_csv(url, storage=Storage(options(server), cache_dir=cache), block_bytes=64 << 10)
    assert len(first) == 40_000
    scanned = len(object_gets(server, "indexed"))
    assert scanned > 0
    again = naiad.read_csv(url, storage=Storage(options(server), cache_dir=cache), block_bytes=64 << 10)
    assert len(again) == 40_000 and again.blocks() == first.blocks()
    assert len(object_gets(server, "indexed")) == scanned  # no GET of the object at all
    assert list((cache / "index").iterdir())


@pytest.mark.timeout(120)
def test_without_a_cache_dir_the_remote_index_lives_in_the_user_cache(server, tmp_path):
    body = b"id,pad\n" + b"".join(b"%d,%s\n" % (i, b"x" * 40) for i in range(40_000))
    url = server.put("user-index/big.csv", body)
    assert len(naiad.read_csv(url, storage=options(server), block_bytes=64 << 10)) == 40_000
    before = len(object_gets(server, "user-index"))
    assert len(naiad.read_csv(url, storage=options(server), block_bytes=64 << 10)) == 40_000
    later = object_gets(server, "user-index")[before:]
    # Only the header and the type sample (the first MiB), never the rest of the 1.8 MB object.
    ends = [int(r.split("-")[1]) for r in later if r]
    assert None not in later and max(ends) < 1 << 20


def test_cache_arguments_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="`cache_bytes` bounds the cache in `cache_dir`"):
        naiad.read_csv(str(tmp_path / "x.csv"), storage=Storage(cache_bytes=100))
    with pytest.raises(ConfigError, match="`cache_bytes` must be an int >= 1"):
        naiad.read("s3://b/x.csv", storage=Storage(cache_dir=tmp_path, cache_bytes=0))


@pytest.mark.timeout(120)
def test_small_blocks_go_through_chunks_the_scan_already_fetched(server, tmp_path, monkeypatch):
    import naiad.sources.cache as cache_module
    import naiad.sources.storage as storage_module

    # Chunks of 4 KiB, so a small object has several (the scan fills them, the epoch reads them).
    monkeypatch.setattr(cache_module, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(storage_module, "CHUNK_BYTES", 4096)
    body = b"id,pad\n" + b"".join(b"%d,%s\n" % (i, b"y" * 20) for i in range(1000))  # about 30 KB
    url = server.put("chunks/a.csv", body)
    cache = tmp_path / "cache"
    src = naiad.read_csv(url, storage=Storage(options(server), cache_dir=cache), block_bytes=500, index_dir=False)
    src.prepare()
    scan_gets = object_gets(server, "chunks")
    assert len(scan_gets) <= -(-len(body) // 4096) + 1  # one request per chunk (and the header's)
    chunks = -(-len(body) // 4096)
    assert chunks <= entries(cache) <= chunks + 1  # the chunks, and the type sample (bigger than a chunk here)
    ids = epoch_ids(naiad.DataLoader(src, batch_size=32, shuffle=True, seed=0))
    assert sorted(ids) == list(range(1000))
    assert object_gets(server, "chunks") == scan_gets  # the epoch's ~60 blocks: no request at all
    # A cache too small to hold the object: each block is its own entry, fetched alone.
    small = tmp_path / "small"
    src = naiad.read_csv(url, storage=Storage(options(server), cache_dir=small, cache_bytes=len(body)),
                         block_bytes=500, index_dir=False)
    assert sorted(epoch_ids(naiad.DataLoader(src, batch_size=32, shuffle=True, seed=0))) == list(range(1000))
    assert entries(small) >= len(src.blocks())


def test_a_fifo_planted_as_a_cache_entry_is_not_waited_on(tmp_path) -> None:
    # An entry is opened without blocking and used only if it is a regular file of its size.
    from naiad.sources.cache import BlockCache

    cache = BlockCache(str(tmp_path / "cache"), 1 << 20)
    key = "ab" + "0" * 38
    path = cache.path(key)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert cache.get(key, 10) is None
    assert cache.get_or_fetch(key, 10, lambda: b"0123456789") == b"0123456789"
    assert cache.get(key, 10) == b"0123456789"
