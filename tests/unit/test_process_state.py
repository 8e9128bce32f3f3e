"""Per-process state (NOTE [ Per-process state ]): every registered state is fresh in a forked
child, what the child inherited is released where its owner said, and the parent's is untouched."""

from __future__ import annotations

import json
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Imported for their registrations: every module that keeps per-process state.
import naiad.dataset.worker
import naiad.media.rows
import naiad.parallel.threads
import naiad.sources.cache
import naiad.sources.engine
import naiad.sources.openfiles
import naiad.sources.parquet
import naiad.sources.readahead
import naiad.sources.storage
import naiad.tokens.mixture  # noqa: F401
from naiad.process_state import ProcessLocal, registered

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")

EXPECTED = {
    "naiad.media.rows decode pool", "naiad.parallel.threads helper", "naiad.sources.cache block caches",
    "naiad.sources.openfiles descriptors", "naiad.sources.readahead io threads", "naiad.sources.storage filesystems",
    "naiad.sources.engine keep decision",
}


def _in_child(check: Callable[[], Any]) -> Any:
    """``check()`` run in a forked child, its JSON answer returned here."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer and leave at once, running none of pytest's exit
        code = 0
        try:
            os.close(read)
            os.write(write, json.dumps(check()).encode())
        except BaseException:  # noqa: BLE001 - reported as the child's exit code
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(answer)


def test_the_modules_states_are_registered_once_each() -> None:
    assert EXPECTED <= set(registered())


@pytest.mark.timeout(30)
def test_a_forked_child_starts_every_state_fresh_and_the_parents_is_untouched(tmp_path: Path) -> None:
    parents = {name: state.get() for name, state in registered().items()}
    (tmp_path / "f.bin").write_bytes(b"abc")
    table = naiad.sources.openfiles.descriptors()
    with table.held([str(tmp_path / "f.bin")], [0]) as fds:
        fd = fds[0]
    generation = table.generation

    def check() -> dict[str, Any]:
        fresh = {name: state.peek() is None for name, state in registered().items()}
        try:
            os.fstat(fd)
            closed = False
        except OSError:
            closed = True
        remade = {name: state.get() is not None for name, state in registered().items()}
        return {"fresh": fresh, "remade": remade, "closed": closed,
                "generation": naiad.sources.openfiles.descriptors().generation}

    got = _in_child(check)
    assert got["fresh"] == dict.fromkeys(registered(), True)
    assert got["remade"] == dict.fromkeys(registered(), True)
    assert got["closed"]  # the child's copy of the kept descriptor: closed there
    assert got["generation"] > generation  # nothing looked up in the parent passes in the child
    assert {name: state.peek() for name, state in registered().items()} == parents
    os.fstat(fd)  # the parent's descriptor stays open
    assert table.generation == generation


@pytest.mark.timeout(30)
def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child() -> None:
    lock = ProcessLocal(threading.Lock, name="test lock")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock.get():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        assert _in_child(lambda: lock.get().acquire(timeout=5)) is True
        assert lock.get().locked()  # the parent's is still the other thread's
    finally:
        release.set()
        thread.join(10)


@pytest.mark.timeout(30)
def test_a_childs_fork_release_sees_the_inherited_value_and_threads_are_not_joined() -> None:
    released: list[int] = []
    state = ProcessLocal(lambda: 7, name="test value", on_fork=released.append)
    pool = ProcessLocal(lambda: naiad.parallel.threads.DaemonThreads(1, name="test-fork"), name="test pool")
    assert state.get() == 7
    assert pool.get().submit(pow, 2, 3).result(5) == 8
    # The child's pool is a new one, whose calls run on the child's own thread.
    assert _in_child(lambda: (released, pool.get().submit(pow, 2, 4).result(5))) == [[7], 16]
    assert released == [] and state.peek() == 7
    pool.get().shutdown(5)


def test_it_pickles_as_its_recipe_never_its_value() -> None:
    state = ProcessLocal(threading.Lock, name="test pickled")
    state.get().acquire()
    copy = pickle.loads(pickle.dumps(state))
    assert copy.name == "test pickled" and copy.peek() is None
    assert copy.get().acquire(blocking=False)
    assert state.take() is not None and state.peek() is None


@pytest.mark.timeout(30)
def test_a_worker_local_dataset_is_built_again_in_a_forked_child() -> None:
    builds: list[int] = []

    def build() -> list[int]:
        builds.append(os.getpid())
        return [1, 2, 3]

    ds = naiad.dataset.worker.WorkerLocal(build, length=3)
    assert ds[0] == 1 and builds == [os.getpid()]
    child = _in_child(lambda: (ds[1], builds[-1]))
    assert child[0] == 2 and child[1] != os.getpid()
    assert builds == [os.getpid()]


@pytest.mark.timeout(30)
def test_a_forked_child_opens_its_own_file_readers(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"a": [1, 2]}), path)
    readers = naiad.sources.parquet._READERS
    mine = readers.get(path)
    assert _in_child(lambda: readers.get(path) is not mine and readers.get(path).metadata.num_rows == 2) is True
    assert readers.get(path) is mine
