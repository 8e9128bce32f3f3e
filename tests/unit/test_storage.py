"""The storage seam without a server: URL kinds, retries, errors, pickling (memory:// and file://)."""

from __future__ import annotations

import errno
import importlib.util
import pickle

import fsspec
import numpy as np
import pytest

import naiad
from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.retries import RetryPolicy, is_transient
from naiad.sources.storage import RangeFile, Storage


@pytest.fixture
def mem():
    fs = fsspec.filesystem("memory")
    fs.mkdir("/naiad-unit")
    yield fs
    fs.rm("/naiad-unit", recursive=True)


def test_urls_and_local_paths_are_told_apart():
    assert storage.is_remote("s3://b/k.csv") and storage.is_remote("memory://x") and storage.is_remote("https://h/x")
    assert not storage.is_remote("/data/x.csv") and not storage.is_remote("file:///data/x.csv")
    assert not storage.is_remote("C:\\data\\x.csv")
    assert storage.local_path("file:///data/x.csv") == "/data/x.csv"


def test_file_urls_read_as_local_paths(tmp_path):
    (tmp_path / "a.csv").write_text("x\n1\n2\n")
    src = naiad.read_csv(f"file://{tmp_path}/*.csv")
    assert src.paths == [str(tmp_path / "a.csv")]
    assert len(src) == 2


def test_memory_urls_glob_read_and_pickle(mem):
    for k in range(3):
        with mem.open(f"/naiad-unit/p{k}.csv", "wb") as f:
            f.write(("id\n" + "".join(f"{k * 10 + i}\n" for i in range(10))).encode())
    src = naiad.read("memory://naiad-unit/p*.csv", block_bytes=8)
    assert [p.replace("memory:///", "memory://") for p in src.paths] == [f"memory://naiad-unit/p{k}.csv" for k in range(3)]
    clone = pickle.loads(pickle.dumps(src))  # what a worker receives
    ids = [int(i) for b in naiad.DataLoader(clone, batch_size=7, shuffle=True, seed=1) for i in b["id"]]
    assert sorted(ids) == list(range(30))


def test_a_storage_pickles_as_plain_data_without_a_filesystem(mem):
    with mem.open("/naiad-unit/a.txt", "wb") as f:
        f.write(b"hello\n")
    src = naiad.read_text("memory://naiad-unit/a.txt", storage={})
    src.storage.filesystem("memory://naiad-unit/a.txt")
    state = pickle.loads(pickle.dumps(src.storage)).__dict__
    assert set(state) == {"options", "retry", "infos", "_key", "cache_dir", "cache_bytes", "endpoint"}
    assert state["infos"]["memory://naiad-unit/a.txt"].size == 6


def test_range_reads_and_range_file(mem):
    with mem.open("/naiad-unit/r.bin", "wb") as f:
        f.write(bytes(range(100)))
    url = "memory://naiad-unit/r.bin"
    store = Storage()
    assert storage.read_range(url, 10, 13, store=store) == bytes([10, 11, 12])
    assert storage.read_range(url, 98, -1, store=store) == bytes([98, 99])
    rf = RangeFile(url, store)
    rf.seek(-4, 2)
    assert rf.read() == bytes([96, 97, 98, 99]) and rf.tell() == 100


def test_an_object_is_read_only_through_a_storage_named_for_it(mem):
    with mem.open("/naiad-unit/n.bin", "wb") as f:
        f.write(b"0123456789")
    url = "memory://naiad-unit/n.bin"
    naiad.read_text(url)  # a source of the URL leaves nothing behind that reads it for others
    with pytest.raises(TypeError, match=r"needs the Storage of its source \(store=\)"):
        storage.read_range(url, 0, 4)
    with pytest.raises(TypeError, match="store="):
        storage.size(url)


def test_filesystems_are_shared_by_storages_of_equal_options_only(mem):
    url = "memory://naiad-unit/x"
    a, b = Storage({"tag": "one"}), Storage({"tag": "one"}, RetryPolicy(attempts=1))
    assert a.filesystem(url) is b.filesystem(url)
    assert pickle.loads(pickle.dumps(a)).filesystem(url) is a.filesystem(url)
    assert Storage({"tag": "two"}).filesystem(url) is not a.filesystem(url)


def test_two_sources_of_one_url_keep_their_own_cache(mem, tmp_path):
    from naiad.sources.cache import cache_stats

    with mem.open("/naiad-unit/c.csv", "wb") as f:
        f.write(("id\n" + "".join(f"{i}\n" for i in range(40))).encode())
    url = "memory://naiad-unit/c.csv"
    cache = tmp_path / "cache"
    # Parsed blocks not kept across epochs: every epoch reads its bytes.
    cached = naiad.read_csv(url, storage=Storage(cache_dir=cache), block_bytes=16, index_dir=False, keep_parsed_bytes=0)
    plain = naiad.read_csv(url, block_bytes=16, index_dir=False, keep_parsed_bytes=0)  # made after, no cache
    pickle.loads(pickle.dumps(plain))  # a worker's copy of it
    ids = [int(i) for b in naiad.DataLoader(plain, batch_size=8) for i in b["id"]]
    assert ids == list(range(40))
    before = cache_stats(cache)
    ids = [int(i) for b in naiad.DataLoader(pickle.loads(pickle.dumps(cached)), batch_size=8) for i in b["id"]]
    assert ids == list(range(40))
    after = cache_stats(cache)
    assert after.hits + after.misses > before.hits + before.misses  # its reads asked its cache
    mem.rm("/naiad-unit/c.csv")  # the cache holds every byte the cached source reads
    again = [int(i) for b in naiad.DataLoader(cached, batch_size=8) for i in b["id"]]
    assert again == list(range(40))
    with pytest.raises(SourceError):
        list(naiad.DataLoader(plain, batch_size=8))


def test_npy_over_a_url_is_read_by_row_ranges(mem):
    arr = np.arange(40, dtype=np.int32).reshape(10, 4)
    with mem.open("/naiad-unit/m.npy", "wb") as f:
        np.save(f, arr)
    src = naiad.read_npy("memory://naiad-unit/m.npy", block_rows=3)
    assert [b.rows for b in src.blocks()] == [3, 3, 3, 1]
    assert np.array_equal(src.read_block(src.blocks()[1]).columns["x"], arr[3:6])


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_missing_extra_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"pip install 'naiad\[gcs\]'"):
        naiad.read_parquet("gs://some-bucket/x.parquet")


def test_storage_options_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must be a dict"):
        naiad.read_csv("memory://x.csv", storage=Storage("anon"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a naiad.Storage or a dict"):
        naiad.read_csv("memory://x.csv", storage="anon")  # type: ignore[arg-type]


class _ClientError(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


def test_what_is_transient():
    assert is_transient(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.ETIMEDOUT, "timed out"))
    assert is_transient(_ClientError(503, "SlowDown")) and is_transient(_ClientError(500, "InternalError"))
    assert is_transient(OSError("An error occurred (SlowDown): reduce your request rate"))
    wrapped = RuntimeError("read failed")
    wrapped.__cause__ = ConnectionResetError()
    assert is_transient(wrapped)
    assert not is_transient(FileNotFoundError("no such key"))
    assert not is_transient(PermissionError("denied"))
    assert not is_transient(_ClientError(403, "AccessDenied"))
    assert not is_transient(ValueError("bad"))


def test_transient_errors_are_retried_until_the_call_succeeds():
    calls = []

    def flaky() -> bytes:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        return b"ok"

    s = Storage(retry=RetryPolicy(attempts=5, base_s=0.001, max_wait_s=0.001))
    assert s.call("s3://b/k", (0, 10), flaky) == b"ok" and len(calls) == 4


def test_retries_are_bounded_and_the_error_names_url_range_and_cause():
    calls = []

    def down() -> bytes:
        calls.append(1)
        raise TimeoutError("read timed out")

    s = Storage(retry=RetryPolicy(attempts=3, base_s=0.001, max_wait_s=0.001))
    with pytest.raises(SourceError, match=r"s3://b/k: reading bytes 5-9 failed after 3 attempt\(s\).*TimeoutError: read timed out"):
        s.call("s3://b/k", (5, 9), down)
    assert len(calls) == 3


def test_a_permanent_error_is_not_retried():
    calls = []

    def missing() -> bytes:
        calls.append(1)
        raise FileNotFoundError("b/k")

    with pytest.raises(SourceError, match=r"s3://b/k: object or bucket not found \(bytes 0-4\)"):
        Storage().call("s3://b/k", (0, 4), missing)
    assert len(calls) == 1


def test_retry_policy_is_checked():
    with pytest.raises(ConfigError, match="attempts"):
        RetryPolicy(attempts=0)
