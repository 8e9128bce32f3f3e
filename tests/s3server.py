"""A real S3-compatible server on loopback (moto's server mode) and a fault-injecting TCP proxy.

Not a mock of the client library: s3fs and botocore speak HTTP to a server on 127.0.0.1, and
the proxy between them drops connections the way a flaky network does (a reset in the middle
of a response).
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3

BUCKET = "naiad-test"
KEY, SECRET = "testing-key", "testing-secret"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server in a thread on a free loopback port, with one bucket."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.client = self.client_for(self.endpoint)
        self.client.create_bucket(Bucket=BUCKET)

    @staticmethod
    def client_for(endpoint: str, key: str = KEY, secret: str = SECRET) -> Any:
        """A boto3 S3 client for ``endpoint``."""
        return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name="us-east-1")

    def put(self, key: str, body: bytes) -> str:
        """Store ``body`` under ``key`` in the bucket; returns its s3:// URL."""
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)
        return f"s3://{BUCKET}/{key}"

    def options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """``storage_options`` that reach this server (or ``endpoint``, a proxy in front of it)."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint or self.endpoint,
                "client_kwargs": {"region_name": "us-east-1"}, **extra}

    def stop(self) -> None:
        """Stop the server (connections to it are refused from then on)."""
        self._server.stop()


class FaultProxy:
    """A TCP proxy on loopback that resets the connection in the middle of every Nth response,
    and can add latency to every request.

    It counts the HTTP ``GET`` requests that pass from client to server; when the count is a
    multiple of ``reset_every`` (0: never), it forwards half of the first chunk of that
    request's response and then resets both sides (SO_LINGER 0: an RST, not a clean close).
    With ``latency_s``, each request waits that long before it is forwarded (a far server's
    round trip); requests on different connections wait at the same time, and the most that
    waited at once is ``max_concurrent``.

    Attributes:
        reset_every: set at any time; 0 turns the faults off.
        latency_s: added before each request is forwarded; set at any time.
        resets: how many responses were cut so far.
        requests: every request so far, as (method, path, Range header or None).
        max_concurrent: the most requests that were waiting out their latency at once.
    """

    def __init__(self, upstream_port: int, reset_every: int = 0, latency_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.reset_every = reset_every
        self.latency_s = latency_s
        self.resets = 0
        self.gets = 0
        self.requests: list[tuple[str, str, str | None]] = []
        self.max_concurrent = 0
        self._waiting = 0
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._sockets += [client, upstream]
            doomed = threading.Event()
            threading.Thread(target=self._requests, args=(client, upstream, doomed), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, doomed), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, doomed: threading.Event) -> None:
        try:
            while chunk := src.recv(65536):
                head = _REQUEST_RE.match(chunk)
                if head:
                    ranged = _RANGE_RE.search(chunk)
                    with self._lock:
                        self.requests.append((head.group(1).decode(), head.group(2).decode(),
                                              ranged.group(1).decode() if ranged else None))
                    if self.latency_s:
                        self._delay()
                if chunk.startswith(b"GET "):
                    with self._lock:
                        self.gets += 1
                        if self.reset_every and self.gets % self.reset_every == 0:
                            doomed.set()
                dst.sendall(chunk)
        except OSError:
            pass
        _close(dst)

    def _responses(self, src: socket.socket, dst: socket.socket, doomed: threading.Event) -> None:
        try:
            while chunk := src.recv(65536):
                if doomed.is_set():
                    dst.sendall(chunk[: max(1, len(chunk) // 2)])
                    with self._lock:
                        self.resets += 1
                    _reset(dst)
                    _reset(src)
                    return
                dst.sendall(chunk)
        except OSError:
            pass
        _close(dst)

    def _delay(self) -> None:
        with self._lock:
            self._waiting += 1
            self.max_concurrent = max(self.max_concurrent, self._waiting)
        time.sleep(self.latency_s)
        with self._lock:
            self._waiting -= 1

    def object_gets(self, key: str) -> list[str | None]:
        """The Range header of every GET of the object ``key`` (None: the whole object)."""
        with self._lock:
            return [r for method, path, r in self.requests if method == "GET" and path.split("?")[0].endswith(f"/{key}")]

    def close(self) -> None:
        """Stop accepting and drop every open connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                _close(s)


_REQUEST_RE = re.compile(rb"^(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.[01]\r\n")
_RANGE_RE = re.compile(rb"\r\n[Rr]ange: *([^\r]+)\r\n")


def _reset(s: socket.socket) -> None:
    # Linger 0 makes close() send an RST; shutting the read side wakes the other pump's recv
    # without sending a FIN first.
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def upload_numbered(s3: S3Server, folder: str, fmt: str, prefix: str, sizes: list[int]) -> str:
    """Write numbered files of ``fmt`` in ``folder`` (tests/conftest_stream.py), upload them under
    ``prefix``; returns the glob URL that names them."""
    import os

    from tests.conftest_stream import write_numbered

    for path in write_numbered(folder, fmt, sizes):
        with open(path, "rb") as f:
            s3.put(f"{prefix}/{os.path.basename(path)}", f.read())
    return f"s3://{BUCKET}/{prefix}/part-*.{fmt}"


def open_numbered_url(url: str, fmt: str, options: dict, **kw: Any) -> Any:
    """A source over numbered files at ``url``, in small blocks (many blocks from few rows);
    ``retry``, ``cache_dir`` and ``cache_bytes`` in ``kw`` go to its Storage."""
    import naiad
    from naiad.sources.storage import Storage

    store = Storage(options, kw.pop("retry", None), cache_dir=kw.pop("cache_dir", None), cache_bytes=kw.pop("cache_bytes", None))
    small = {"block_bytes": 64} if fmt in ("csv", "jsonl", "text") else {"block_rows": 9} if fmt == "npy" else {}
    reader = naiad.read_text if fmt == "text" else naiad.read
    return reader(url, storage=store, **small, **kw)


def batch_ids(batch: dict) -> list[int]:
    """The row numbers of a batch of numbered rows (a text line is its number)."""
    import torch

    if "text" in batch:
        return [int(v) for v in batch["text"]]
    col = batch["id"] if "id" in batch else batch["x"]
    return torch.as_tensor(col).long().tolist()


def epoch_ids(loader: Any) -> list[int]:
    """The row numbers of an epoch, in the order delivered."""
    return [i for batch in loader for i in batch_ids(batch)]


def own_server() -> Iterator[S3Server]:
    """A server of the test's own behind a :class:`FaultProxy` (``s3.proxy``), so the test may
    stop it (:func:`stop_server`); closed at the end (the body of a pytest fixture)."""
    s3 = S3Server()
    proxy = FaultProxy(s3.port)
    s3.proxy = proxy  # type: ignore[attr-defined]
    yield s3
    proxy.close()
    if not getattr(s3, "stopped", False):
        s3.stop()


def stop_server(s3: S3Server) -> None:
    """Stop a server of :func:`own_server` within the test."""
    s3.stop()
    s3.stopped = True  # type: ignore[attr-defined]

