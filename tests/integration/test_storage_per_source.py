"""Two sources of one URL each read with their own Storage (options, retries, cache), against a
real S3 server on loopback (tests/s3server.py), in this process and in process workers.

The proxy in front of the server logs every request, so which endpoint a read went to is
seen; stopping the server shows which reads a cache answers.
"""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")

import naiad  # noqa: E402
from naiad.errors import SourceError  # noqa: E402
from naiad.sources.cache import cache_stats  # noqa: E402
from naiad.sources.retries import RetryPolicy  # noqa: E402
from naiad.sources.storage import Storage  # noqa: E402
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

SIZES = [31, 0, 17]
TOTAL = sum(SIZES)
FAST_FAIL = RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01)


@pytest.fixture
def server():
    """A server of the test's own, so the test may stop it."""
    yield from own_server()


stop = stop_server


def proxied(s3: S3Server) -> dict:
    """Options that reach the server through the logging proxy (the client's retries off)."""
    return s3.options(s3.proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})


def direct(s3: S3Server) -> dict:
    """Options that reach the server itself: the proxy never sees these requests."""
    return s3.options(config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})


def proxy_gets(s3: S3Server, prefix: str) -> int:
    return sum(1 for m, p, _ in s3.proxy.requests if m == "GET" and f"/{BUCKET}/{prefix}/" in p)


def asked(cache) -> int:
    """Reads the block cache answered or fetched for (every process's)."""
    stats = cache_stats(cache)
    return stats.hits + stats.misses


def unkept(fmt: str) -> dict:
    """Parsed blocks not kept across epochs (NOTE [ Kept blocks ]): every epoch reads its bytes."""
    return {"keep_parsed_bytes": 0} if fmt in ("csv", "jsonl", "text") else {}


def epoch(src: naiad.sources.Source, **kw) -> list[int]:
    return epoch_ids(naiad.DataLoader(src, batch_size=8, shuffle=True, seed=5, **kw))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cached_source_keeps_its_cache_after_an_uncached_source_of_the_same_url(server, tmp_path, fmt):
    url = upload_numbered(server, str(tmp_path), fmt, f"two-caches/{fmt}", SIZES)
    cache = tmp_path / "cache"
    cached = open_numbered_url(url, fmt, proxied(server), cache_dir=cache, retry=FAST_FAIL, **unkept(fmt))
    plain = open_numbered_url(url, fmt, proxied(server), retry=FAST_FAIL, **unkept(fmt))  # the same objects, no cache
    assert sorted(epoch(plain)) == list(range(TOTAL))
    pickle.loads(pickle.dumps(plain))  # what a worker does with it
    before = asked(cache)
    assert sorted(epoch(cached)) == list(range(TOTAL))
    assert asked(cache) > before  # its reads went through its cache
    stop(server)
    # The cache answers every read of the cached source; the other one has nothing to read from.
    assert sorted(epoch(cached)) == list(range(TOTAL))
    assert sorted(epoch(pickle.loads(pickle.dumps(cached)))) == list(range(TOTAL))
    with pytest.raises(SourceError, match="failed after 2 attempt"):
        epoch(plain)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_process_workers_read_through_their_sources_cache_after_another_source_of_the_url(server, tmp_path, fmt):
    url = upload_numbered(server, str(tmp_path), fmt, f"two-caches-workers/{fmt}", SIZES)
    cache = tmp_path / "cache"
    cached = open_numbered_url(url, fmt, proxied(server), cache_dir=cache, retry=FAST_FAIL)
    plain = open_numbered_url(url, fmt, proxied(server), retry=FAST_FAIL)
    cached.prepare()
    plain.prepare()
    before = asked(cache)
    assert sorted(epoch(cached, num_workers=2, multiprocessing_context="spawn")) == list(range(TOTAL))
    assert asked(cache) > before
    stop(server)
    assert sorted(epoch(cached, num_workers=2, multiprocessing_context="spawn")) == list(range(TOTAL))
    with pytest.raises(SourceError):
        epoch(plain, num_workers=2, multiprocessing_context="spawn")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", FORMATS)
def test_two_sources_of_one_url_each_reach_their_own_endpoint(server, tmp_path, fmt):
    url = upload_numbered(server, str(tmp_path), fmt, f"endpoints/{fmt}", SIZES)
    prefix = f"endpoints/{fmt}"
    through_proxy = open_numbered_url(url, fmt, proxied(server))
    straight = open_numbered_url(url, fmt, direct(server))  # made last, and unpickled last
    pickle.loads(pickle.dumps(straight))
    seen = proxy_gets(server, prefix)
    assert sorted(epoch(straight)) == list(range(TOTAL))
    assert proxy_gets(server, prefix) == seen  # not one request through the proxy
    assert sorted(epoch(through_proxy)) == list(range(TOTAL))
    assert proxy_gets(server, prefix) > seen  # its own endpoint: the proxy


@pytest.mark.timeout(180)
def test_process_workers_of_two_sources_of_one_url_each_reach_their_own_endpoint(server, tmp_path):
    url = upload_numbered(server, str(tmp_path), "parquet", "endpoints-workers", SIZES)
    through_proxy = open_numbered_url(url, "parquet", proxied(server))
    straight = open_numbered_url(url, "parquet", direct(server))
    seen = proxy_gets(server, "endpoints-workers")
    assert sorted(epoch(straight, num_workers=2, multiprocessing_context="spawn")) == list(range(TOTAL))
    assert proxy_gets(server, "endpoints-workers") == seen
    assert sorted(epoch(through_proxy, num_workers=2, multiprocessing_context="spawn")) == list(range(TOTAL))
    assert proxy_gets(server, "endpoints-workers") > seen


@pytest.mark.timeout(120)
def test_two_sources_of_one_url_each_retry_by_their_own_policy(server, tmp_path):
    url = upload_numbered(server, str(tmp_path), "csv", "policies", [50])
    twice = naiad.read_csv(url, storage=Storage(proxied(server), FAST_FAIL), block_bytes=64)
    thrice = naiad.read_csv(url, storage=Storage(proxied(server), RetryPolicy(attempts=3, base_s=0.01, max_wait_s=0.01)),
                            block_bytes=64)
    twice.prepare()
    thrice.prepare()
    server.proxy.reset_every = 1  # every response from now on
    with pytest.raises(SourceError, match=r"failed after 2 attempt\(s\)"):
        epoch(twice)
    with pytest.raises(SourceError, match=r"failed after 3 attempt\(s\)"):
        epoch(thrice)
    with pytest.raises(SourceError, match=r"failed after 2 attempt\(s\)"):
        epoch(pickle.loads(pickle.dumps(twice)))
