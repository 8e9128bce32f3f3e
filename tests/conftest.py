"""Test configuration shared by every suite."""

import gc
import os
import sys
import uuid

import pytest

# `tests.helpers` is importable whether pytest runs from the repo root or elsewhere.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.processes import MARKER, command, describe, kill, marked, parent, wait_gone  # noqa: E402

# Block indexes (and other cached data) of the tests' files go to a folder of this run, not to
# the user's cache; child processes inherit it.
if "NAIAD_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["NAIAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="naiad-test-cache-")

    def _remove_cache(path: str = os.environ["NAIAD_CACHE_DIR"], owner: int = os.getpid()) -> None:
        if os.getpid() == owner:  # the run that made it; never a forked child ending
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(_remove_cache)

# Property tests draw new examples on every local run; under CI the same ones each run, so a
# run fails for the change it tests, never for a draw (a local run finds what a draw finds).
if os.environ.get("CI"):
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.load_profile("ci")

# Every process the run starts inherits this marker (.ci/run sets its own): what is still alive
# at the end of the session is found by it, orphans included.
os.environ.setdefault(MARKER, f"pytest-{uuid.uuid4().hex}")
# And this session's own marker, always new: a pytest that a test starts (the device check's
# collection, say) inherits the run's marker but checks only what it started itself, never its
# siblings of the outer run (their multiprocessing helpers included).
SESSION = "NAIAD_TEST_SESSION"
os.environ[SESSION] = f"session-{uuid.uuid4().hex}"

# multiprocessing's helpers that this interpreter started live as long as it, and end with it.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _leftovers(wait_s: float) -> list[int]:
    """The run's processes still alive after ``wait_s`` seconds, but for this process, its
    ancestors (which may carry the marker: .ci/run's shell) and multiprocessing's helpers."""
    me = os.getpid()
    exclude = {me}
    ancestor = parent(me)
    while ancestor:
        exclude.add(ancestor)
        ancestor = parent(ancestor)
    for pid in marked(os.environ[SESSION], SESSION, exclude=exclude):
        # The forkserver's own children (workers) have its command line too: only the helpers
        # started by this process itself are passed over.
        if parent(pid) == me and any(h in command(pid) for h in _INTERPRETER_HELPERS):
            exclude.add(pid)
    return wait_gone(os.environ[SESSION], wait_s, SESSION, exclude=exclude)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process a test started outlived the tests (after every fixture's
    teardown, and time for pools that the garbage collector closes to end their workers)."""
    if not os.path.isdir("/proc"):
        return
    gc.collect()
    left = _leftovers(wait_s=15.0)
    if not left:
        return
    lines = [describe(pid) for pid in left]
    kill(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_sep("=", f"{len(left)} process(es) started by the tests outlived them (now killed)", red=True)
        for line in lines:
            reporter.write_line(line)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
