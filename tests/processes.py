"""The processes a test run started, found by a marker in their environment, and their end.

Every process the suite starts inherits ``NAIAD_TEST_RUN`` (``tests/conftest.py`` sets it where
the caller did not; ``.ci/run`` sets its own), so whatever a run left behind can be found after
it, orphans included: a worker whose parent was killed is reparented and no longer descends from
pytest, and torchrun starts each rank in a session of its own.

Standard library only, and Linux only (``/proc``; elsewhere nothing is found): ``.ci/run`` calls
it after pytest has exited, as ``python tests/processes.py RUN_ID``, which waits a while for the
run's processes to go, then lists and kills any still alive and exits 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable

MARKER = "NAIAD_TEST_RUN"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return b""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs: neither gone nor a zombie waiting for its parent to reap it."""
    stat = _read(f"/proc/{pid}/stat")
    # The state follows the command name, which is in parentheses and may hold any character.
    return bool(stat) and stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def marked(value: str, key: str = MARKER, exclude: Iterable[int] = ()) -> list[int]:
    """The live processes whose environment has ``key=value`` (read from ``/proc/PID/environ``,
    the environment a process started with), but for those in ``exclude``."""
    if not os.path.isdir("/proc"):
        return []
    entry = f"{key}={value}".encode()
    skip = set(exclude)
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in skip and entry in _read(f"/proc/{name}/environ").split(b"\0"):
            if _alive(int(name)):
                found.append(int(name))
    return sorted(found)


def parent(pid: int) -> int | None:
    """The parent of ``pid``, or None when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def command(pid: int) -> str:
    """The command line of ``pid`` ("" when it is gone)."""
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def describe(pid: int) -> str:
    """``pid``, its parent and its command line, for a report."""
    return f"pid {pid} (parent {parent(pid)}): {command(pid)[:300] or '?'}"


def kill(pids: Iterable[int], timeout_s: float = 10.0) -> list[int]:
    """SIGKILL ``pids`` and wait for them to go; returns those still alive after ``timeout_s``."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def wait_gone(value: str, timeout_s: float, key: str = MARKER, exclude: Iterable[int] = ()) -> list[int]:
    """Wait up to ``timeout_s`` for the processes marked ``key=value`` to end; returns those left."""
    deadline = time.monotonic() + timeout_s
    while (left := marked(value, key, exclude)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def main(argv: list[str]) -> int:
    """``processes.py RUN_ID [WAIT_S]``: exit 1, listing and killing them, when processes marked
    ``NAIAD_TEST_RUN=RUN_ID`` are still alive after ``WAIT_S`` (15) seconds."""
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} RUN_ID [WAIT_S]", file=sys.stderr)
        return 2
    # multiprocessing's resource tracker and forkserver end a moment after pytest: their pipes close.
    left = wait_gone(argv[1], float(argv[2]) if len(argv) == 3 else 15.0, exclude=[os.getpid()])
    if not left:
        return 0
    print(f"{len(left)} process(es) the test run started outlived it (now killed):", file=sys.stderr)
    for pid in left:
        print(f"  {describe(pid)}", file=sys.stderr)
    kill(left)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
