"""The block cache's mechanics on a real folder: LRU eviction, whole entries only, locks."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from naiad.errors import ConfigError
from naiad.sources import cache as cache_mod
from naiad.sources.cache import BlockCache, cache_key, resolve_cache_dir
from naiad.sources.cache import user_cache_dir as user_cache


def put(cache: BlockCache, key: str, data: bytes) -> bytes:
    return cache.get_or_fetch(key, len(data), lambda: data)


def test_a_hit_is_read_from_disk_without_fetching(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20)
    assert put(cache, "ab" * 20, b"hello") == b"hello"
    assert cache.get_or_fetch("ab" * 20, 5, lambda: pytest.fail("fetched a cached entry")) == b"hello"
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_eviction_removes_the_least_recently_used_first(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20)
    keys = [f"{i:02d}" + "0" * 38 for i in range(4)]
    for i, key in enumerate(keys):
        put(cache, key, bytes(3000))
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # written in this order, long ago
    cache.get(keys[0], 3000)  # a hit: now the most recently used
    cache.max_bytes = 10_000
    cache.evict()  # 12,000 bytes > 10,000: down to 9,000
    assert [cache.path(k).exists() for k in keys] == [True, False, True, True]
    assert cache.total_bytes() <= 10_000


def test_writes_past_cache_bytes_evict_on_their_own(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 5_000)
    for i in range(20):
        put(cache, f"{i:02d}" + "1" * 38, bytes(1000))
    assert cache.total_bytes() <= 5_000
    assert cache.stats.evicted >= 15


def test_an_entry_cut_short_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20)
    key = "cd" * 20
    put(cache, key, b"0123456789")
    cache.path(key).write_bytes(b"01234")  # a crash mid-write on a filesystem without rename
    assert cache.get(key, 10) is None and not cache.path(key).exists()
    assert put(cache, key, b"0123456789") == b"0123456789"


def test_an_entry_larger_than_the_cache_is_fetched_not_stored(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 100)
    assert put(cache, "ef" * 20, bytes(500)) == bytes(500)
    assert not cache.path("ef" * 20).exists()


def test_a_waiter_reads_what_the_lock_holder_wrote(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20)
    key = "12" * 20
    path = cache.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    lock.touch()  # another process is fetching it

    def finish() -> None:
        time.sleep(0.2)
        path.write_bytes(b"theirs")
        lock.unlink()

    t = threading.Thread(target=finish)
    t.start()
    assert cache.get_or_fetch(key, 6, lambda: pytest.fail("fetched while another process held the lock")) == b"theirs"
    t.join()
    assert cache.stats.waits == 1


def test_a_stale_lock_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "LOCK_STALE_S", 0.05)
    cache = BlockCache(str(tmp_path), 1 << 20)
    key = "34" * 20
    path = cache.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    lock.touch()
    os.utime(lock, (1, 1))  # its holder died long ago
    assert cache.get_or_fetch(key, 4, lambda: b"mine") == b"mine"
    assert path.read_bytes() == b"mine" and not lock.exists()


def test_no_temporary_or_lock_file_is_left_behind(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20)
    threads = [threading.Thread(target=put, args=(cache, f"{i % 3:02d}" + "5" * 38, bytes(100))) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [p.name for p in (tmp_path / "blocks").rglob("*") if p.is_file()]
    assert len(names) == 3 and not [n for n in names if n.startswith(".tmp-") or n.endswith(".lock")]
    assert cache.stats.misses == 3  # threads of one process wait on each other too


def test_a_key_names_the_version_of_the_object() -> None:
    a = cache_key("http://e", "s3://b/x.csv", 100, "etag:1", 0, 64)
    assert a != cache_key("http://e", "s3://b/x.csv", 100, "etag:2", 0, 64)
    assert a != cache_key("http://f", "s3://b/x.csv", 100, "etag:1", 0, 64)
    assert a != cache_key("http://e", "s3://b/x.csv", 100, "etag:1", 0, 65)
    assert a == cache_key("http://e", "s3://b/x.csv", 100, "etag:1", 0, 64)


def test_cache_arguments(tmp_path: Path) -> None:
    assert resolve_cache_dir(None, None) is None
    assert resolve_cache_dir(tmp_path / "c", 10) == str(tmp_path / "c")
    assert resolve_cache_dir("auto", None) == str((user_cache() / "remote").absolute())
    with pytest.raises(ConfigError, match="`cache_bytes` must be an int >= 1"):
        resolve_cache_dir(tmp_path, -1)
    with pytest.raises(ConfigError, match="pass cache_dir= too"):
        resolve_cache_dir(None, 1 << 20)
    with pytest.raises(ConfigError, match="`cache_dir` must be a folder"):
        resolve_cache_dir(3, None)  # type: ignore[arg-type]


def test_a_write_during_an_eviction_is_counted_and_evicted_after_it(tmp_path: Path) -> None:
    # Read-ahead threads write while one of them evicts: a write after the listing is not in
    # it, and the eviction in progress must count it (it used to be lost, leaving the cache
    # one entry past cache_bytes).
    cache = BlockCache(str(tmp_path), 1 << 20)
    for i in range(4):
        put(cache, f"{i:02d}" + "2" * 38, bytes(1000))
    cache.max_bytes = 5_000
    listing = cache._evict_once
    wrote_late = []

    def listing_then_a_late_write() -> tuple[int, int]:
        out = listing()
        if not wrote_late:
            wrote_late.append(True)
            put(cache, "ff" + "3" * 38, bytes(2000))  # another thread's write: no second listing now
        return out

    cache._evict_once = listing_then_a_late_write  # type: ignore[method-assign]
    put(cache, "04" + "2" * 38, bytes(1000))  # the last write: 5,000 bytes, then 2,000 during its listing
    assert wrote_late and cache.path("ff" + "3" * 38).exists()
    assert cache.total_bytes() <= 5_000
    assert cache.stats.evicted > 0


def test_one_eviction_at_a_time_across_threads(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 20_000)
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(40):
                put(cache, f"{t:02d}{i:03d}" + "4" * 35, bytes(900))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    assert cache.total_bytes() <= 20_000
