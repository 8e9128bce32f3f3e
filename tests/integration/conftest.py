"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """An S3 server on loopback (moto), one per test module: tests/s3server.py."""
    pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
    pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")
    from tests.s3server import S3Server

    server = S3Server()
    yield server
    server.stop()
