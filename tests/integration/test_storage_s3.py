"""Training from object storage: every reader over s3:// URLs against a real S3 server on loopback.

moto's server mode answers on 127.0.0.1 (started and stopped by a fixture); s3fs talks HTTP to
it. A fault-injecting proxy between them resets connections mid-response.
"""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")

import naiad  # noqa: E402
from naiad.errors import SourceError  # noqa: E402
from naiad.sources.retries import RetryPolicy
from naiad.sources.storage import Storage
from naiad.testing import check_resume  # noqa: E402
from tests.conftest_stream import FORMATS  # noqa: E402
from tests.s3server import (  # noqa: E402
    BUCKET,
    FaultProxy,
    S3Server,
    epoch_ids,
    open_numbered_url,
    upload_numbered,
)

SIZES = [61, 0, 23, 40]  # uneven files and an empty one
TOTAL = sum(SIZES)


def upload(s3: S3Server, tmp_path, fmt: str, prefix: str, sizes=SIZES) -> str:
    """Write numbered files locally, upload them under ``prefix``; returns the glob URL."""
    return upload_numbered(s3, str(tmp_path), fmt, prefix, sizes)


def open_url(url: str, fmt: str, options: dict, **kw) -> naiad.sources.Source:
    return open_numbered_url(url, fmt, options, **kw)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_every_row_from_an_s3_glob(s3, tmp_path, fmt):
    url = upload(s3, tmp_path, fmt, f"all/{fmt}")
    src = open_url(url, fmt, s3.options())
    assert all(p.startswith(f"s3://{BUCKET}/all/{fmt}/part-") for p in src.paths) and len(src.paths) == 4
    assert len(src) == TOTAL
    ids = epoch_ids(naiad.DataLoader(src, batch_size=8, shuffle=True, seed=5))
    assert sorted(ids) == list(range(TOTAL))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_exactly_once_across_process_workers_and_ranks(s3, tmp_path, fmt):
    url = upload(s3, tmp_path, fmt, f"ranks/{fmt}")
    per_rank = []
    for rank in range(2):
        src = open_url(url, fmt, s3.options())
        loader = naiad.DataLoader(src, batch_size=6, shuffle=True, seed=7, shuffle_buffer=20,
                                  num_workers=2, rank=rank, world_size=2)
        per_rank.append(epoch_ids(loader))
    assert len(per_rank[0]) == len(per_rank[1])  # equal steps per rank
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(TOTAL))


@pytest.mark.timeout(180)
def test_spawned_workers_rebuild_the_filesystem_from_the_options(s3, tmp_path):
    # spawn pickles the source: its Storage (options, retries, sizes) crosses, no live filesystem.
    url = upload(s3, tmp_path, "parquet", "spawn")
    src = naiad.read(url, storage=s3.options())
    loader = naiad.DataLoader(src, batch_size=10, num_workers=2, multiprocessing_context="spawn")
    assert sorted(epoch_ids(loader)) == list(range(TOTAL))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_resume_mid_epoch_is_exact(s3, tmp_path, fmt):
    url = upload(s3, tmp_path, fmt, f"resume/{fmt}")
    report = check_resume(
        lambda: naiad.DataLoader(open_url(url, fmt, s3.options()), batch_size=7, shuffle=True, seed=3,
                                 shuffle_buffer=15),
        epochs=1, positions=[0.5],
    )
    assert report is not None


def test_a_missing_object_fails_at_construction_naming_it(s3):
    with pytest.raises(SourceError, match=rf"s3://{BUCKET}/nowhere/x.csv: object or bucket not found"):
        naiad.read_csv(f"s3://{BUCKET}/nowhere/x.csv", storage=s3.options())


def test_a_missing_bucket_fails_at_construction(s3):
    with pytest.raises(SourceError, match="no-such-bucket-here/x.parquet: object or bucket not found"):
        naiad.read_parquet("s3://no-such-bucket-here/x.parquet", storage=s3.options())


def test_a_glob_that_matches_nothing_fails_at_construction(s3):
    with pytest.raises(SourceError, match=rf"s3://{BUCKET}/empty/\*.csv: the pattern matches no object"):
        naiad.read(f"s3://{BUCKET}/empty/*.csv", storage=s3.options())


def test_an_object_deleted_after_construction_is_a_source_error_naming_it(s3, tmp_path):
    url = upload(s3, tmp_path, "csv", "deleted", sizes=[30])
    src = naiad.read_csv(url, storage=s3.options(), block_bytes=64)
    s3.client.delete_object(Bucket=BUCKET, Key="deleted/part-000.csv")
    with pytest.raises(SourceError, match="deleted/part-000.csv: object or bucket not found"):
        epoch_ids(naiad.DataLoader(src, batch_size=8))


@pytest.mark.timeout(60)
def test_wrong_credentials_are_refused_at_construction(tmp_path):
    # moto accepts any credentials until told to check them (its reset-auth switch); then only
    # the keys of an IAM user it issued pass. Its own server, so the switch touches no other test.
    server = S3Server()
    try:
        iam = __import__("boto3").client("iam", endpoint_url=server.endpoint, aws_access_key_id="a",
                                         aws_secret_access_key="b", region_name="us-east-1")
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        url = server.put("auth/a.csv", b"id\n1\n2\n")
        _moto_auth(server, b"0")
        try:
            with pytest.raises(SourceError, match=r"auth/a.csv: access refused .*check the credentials"):
                naiad.read_csv(url, storage=server.options(key="not-a-key", secret="nope"))
            good = server.options(key=key["AccessKeyId"], secret=key["SecretAccessKey"])
            assert sorted(epoch_ids(naiad.DataLoader(naiad.read_csv(url, storage=good), batch_size=4))) == [1, 2]
        finally:
            _moto_auth(server, b"inf")
    finally:
        server.stop()


def _moto_auth(server: S3Server, count: bytes) -> None:
    """moto checks credentials after ``count`` more requests ("inf": never)."""
    urllib.request.urlopen(urllib.request.Request(
        f"{server.endpoint}/moto-api/reset-auth", data=count, method="POST", headers={"Content-Type": "text/plain"}))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_connections_reset_mid_response_are_retried_with_every_row_once(s3, tmp_path, fmt):
    url = upload(s3, tmp_path, fmt, f"faults/{fmt}")
    proxy = FaultProxy(s3.port)
    try:
        # The client's own retries off: what recovers here is naiad's (NOTE [ Retries ]).
        options = s3.options(proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}})
        src = open_url(url, fmt, options, retry=RetryPolicy(attempts=20, base_s=0.01, max_wait_s=0.05))
        proxy.reset_every = 3
        per_rank = []
        for rank in range(2):
            loader = naiad.DataLoader(src, batch_size=6, shuffle=True, seed=2, num_workers=2, rank=rank, world_size=2)
            per_rank.append(epoch_ids(loader))
        assert proxy.resets >= 3
        assert sorted(per_rank[0] + per_rank[1]) == list(range(TOTAL))
    finally:
        proxy.close()


@pytest.mark.timeout(120)
def test_retries_exhausted_name_the_url_the_byte_range_and_the_cause(s3, tmp_path):
    url = upload(s3, tmp_path, "csv", "exhaust", sizes=[50])
    proxy = FaultProxy(s3.port)
    try:
        options = s3.options(proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}})
        src = naiad.read_csv(url, storage=Storage(options, RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01)),
                             block_bytes=64)
        src.blocks()
        proxy.reset_every = 1  # every response from now on
        with pytest.raises(SourceError, match=r"exhaust/part-000.csv: reading bytes \d+-\d+ failed after 2 attempt\(s\)"):
            epoch_ids(naiad.DataLoader(src, batch_size=8))
    finally:
        proxy.close()


def test_npy_row_ranges_are_read_from_the_object(s3):
    import io

    buf = io.BytesIO()
    arr = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.save(buf, arr)
    url = s3.put("npy/m.npy", buf.getvalue())
    src = naiad.read_npy(url, storage=s3.options(), block_rows=6)
    block = src.blocks()[1]
    assert np.array_equal(src.read_block(block, 1, 4).columns["x"], arr[7:10])
