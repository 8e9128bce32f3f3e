"""Retries of remote calls: which errors are transient, and how long to keep trying.

NOTE [ Retries ]
Object stores fail transiently: a connection reset, a timeout, an HTTP 5xx, throttling. Every
remote call (a range read, a listing, a HEAD) is retried with exponential backoff and full
jitter, within a bounded number of attempts and a time budget (:class:`RetryPolicy`); then a
:class:`~naiad.SourceError` names the URL, the byte range and the cause. A missing object,
a refused credential or a glob that matches nothing is not transient: it fails at once, at
construction when it can be seen there. A read is idempotent (a range of an object whose size
and ETag were recorded), so a retried block yields the same rows: exactly-once holds.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from naiad.errors import ConfigError, SourceError

__all__ = ["RetryPolicy", "is_transient", "retrying"]

T = TypeVar("T")

_LOG = logging.getLogger("naiad.storage")


def retrying(policy: RetryPolicy, url: str, byte_range: tuple[int, int] | None, op: Callable[[], T]) -> T:
    """``op()``, retried on transient errors as ``policy`` says; other errors become a
    SourceError naming ``url`` (and ``byte_range``)."""
    began = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - classified below, never swallowed
            if not is_transient(exc):
                raise _remote_error(exc, url, byte_range) from exc
            wait = random.uniform(0, min(policy.max_wait_s, policy.base_s * 2 ** (attempt - 1)))
            if attempt >= policy.attempts or time.monotonic() - began + wait > policy.budget_s:
                where = f" bytes {byte_range[0]}-{byte_range[1]}" if byte_range else ""
                raise SourceError(
                    f"reading{where} failed after {attempt} attempt(s) in {time.monotonic() - began:.1f} s: "
                    f"{_describe(exc)}", path=url,
                ) from exc
            _LOG.warning("naiad: %s%s failed (attempt %d of %d): %s; retrying in %.2f s.", url,
                         f" bytes {byte_range[0]}-{byte_range[1]}" if byte_range else "", attempt, policy.attempts,
                         _describe(exc), wait)
            time.sleep(wait)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient errors of remote reads are retried (see NOTE [ Retries ]).

    Attributes:
        attempts: tries in all, the first included (1: no retry).
        base_s: the first backoff; each next one doubles, up to ``max_wait_s``, with full jitter.
        max_wait_s: the longest single wait.
        budget_s: no retry starts after this many seconds since the first try.
    """

    attempts: int = 8
    base_s: float = 0.1
    max_wait_s: float = 5.0
    budget_s: float = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"`RetryPolicy.attempts` must be >= 1, got {self.attempts}.")
        if min(self.base_s, self.max_wait_s, self.budget_s) < 0:
            raise ConfigError("`RetryPolicy` times must be >= 0.")


_TRANSIENT_NAMES = {
    "ClientConnectionError", "ClientOSError", "ServerDisconnectedError", "ClientPayloadError",
    "ServerTimeoutError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
    "ConnectTimeoutError", "IncompleteRead", "ResponseStreamingError", "ProtocolError",
    "ContentLengthError", "TransferEncodingError", "ClientResponseError",
}
_TRANSIENT_CODES = (
    "SlowDown", "Throttl", "RequestTimeout", "InternalError", "ServiceUnavailable", "TooManyRequests",
    "RequestLimitExceeded", "BandwidthLimitExceeded",
)
_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET}


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is worth a retry: a dropped connection, a timeout,
    a 5xx, throttling. A missing object or a refused credential is not."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        seen += 1
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if any(t.__name__ in _TRANSIENT_NAMES for t in type(e).__mro__):
            status = getattr(e, "status", None)
            return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 429))
        status = _http_status(e)
        if status is not None and (status >= 500 or status in (408, 429)):
            return True
        if any(code in str(e) for code in _TRANSIENT_CODES):
            return True
        e = e.__cause__ or e.__context__
    return False


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if isinstance(status, int) else None
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text[:300]}"


def _remote_error(exc: BaseException, url: str, byte_range: tuple[int, int] | None) -> BaseException:
    """A non-transient failure in words (or the error itself when it is already naiad's)."""
    if isinstance(exc, (SourceError, ConfigError)):
        return exc
    where = f" (bytes {byte_range[0]}-{byte_range[1]})" if byte_range else ""
    if isinstance(exc, FileNotFoundError):
        return SourceError(f"object or bucket not found{where}.", path=url)
    if isinstance(exc, PermissionError) or _http_status(exc) in (401, 403):
        return SourceError(
            f"access refused{where} ({_describe(exc)}): check the credentials (storage_options= "
            "or the environment) and the permissions on the bucket.", path=url,
        )
    return SourceError(f"cannot read{where}: {_describe(exc)}", path=url)
