"""The rules every case of the sample and token fuzzers obeys, whatever it reads: where its choices
come from (:class:`Pick`), how long its read may take (:func:`within_case_time`), that process
workers leave nothing behind (:func:`settled`), that nothing outside the data's folder is read
(:data:`SECRET`). That a naiad error names the file it is about is checked by
``tests.fuzz.formats.assert_named``, shared with the reader fuzzers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

T = TypeVar("T")
CASE_S = 10.0
"""The most one case may take (its reads take milliseconds: more is a finding)."""
SECRET = b"SECRET-OUTSIDE"
"""What every file outside the data's folder holds: it must never be read."""


class Pick(Protocol):
    """Where a case's choices come from: ``random.Random``, or hypothesis's draws."""

    def choice(self, seq: Sequence[T]) -> T: ...

    def random(self) -> float: ...

    def randrange(self, start: int, stop: int) -> int: ...


@contextmanager
def within_case_time(what: str) -> Iterator[None]:
    """Fail when the block takes more than ``CASE_S`` seconds."""
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    assert took <= CASE_S, f"{what} took {took:.1f} s"


def settled(before_pids: set[int], before_shm: set[str]) -> None:
    """``tests.helpers.settle_workers``, on a machine where other processes come and go: a
    /dev/shm entry left by the workers fails only if it is still there a second later (a
    semaphore another process is making is there for a moment)."""
    from tests.helpers import settle_workers, shm_entries

    try:
        settle_workers(before_pids, before_shm)
    except AssertionError as exc:
        if "shared memory" not in str(exc):
            raise
        left = shm_entries() - before_shm
        deadline = time.monotonic() + 1.0
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left &= shm_entries()
        assert not left, f"shared memory left behind: {left}"
