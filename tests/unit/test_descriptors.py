"""The process's table of kept descriptors (NOTE [ Open files ] in sources/openfiles.py): bounded,
never closing a descriptor a read may be using, and telling readers when what they looked up
may have gone."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from naiad.sources.openfiles import Descriptors, open_files_budget

pytestmark = pytest.mark.timeout(60)


def files(tmp_path: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        path = tmp_path / f"f{i:03d}"
        path.write_bytes(bytes([i % 256]) * 8)
        out.append(str(path))
    return out


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_at_most_capacity_descriptors_stay_open_the_oldest_closed_first(tmp_path: Path) -> None:
    paths = files(tmp_path, 30)
    table = Descriptors(8)
    seen = {}
    for i in range(30):
        with table.held(paths, [i]) as fds:
            assert os.pread(fds[i], 1, 0) == bytes([i])
            seen[i] = fds[i]
        assert len(table) <= 8
    assert table.generation == 22  # 22 set aside, each closed when its read ended
    with table.held(paths, range(22, 30)) as fds:
        assert fds == {i: seen[i] for i in range(22, 30)}  # the newest 8: not opened again
    table.close_all()


def test_a_descriptor_in_use_is_set_aside_not_closed_until_the_read_ends(tmp_path: Path) -> None:
    paths = files(tmp_path, 10)
    table = Descriptors(4)
    before = table.enter()
    mine = table.lookup(paths, [0])[0]
    other = threading.Thread(target=lambda: [table.lookup(paths, [i]) for i in range(1, 10)])
    other.start()  # another reader inside the same read's time: evicts file 0
    other.join(10)
    assert table.generation > before  # what was looked up at `before` may be gone later
    assert is_open(mine) and os.pread(mine, 1, 0) == bytes([0])  # but not while this read runs
    table.leave()
    with table.held(paths, [9]):
        pass
    assert len(table) <= 4
    table.close_all()


def test_a_new_read_waits_while_set_aside_descriptors_pile_up(tmp_path: Path) -> None:
    paths = files(tmp_path, 40)
    table = Descriptors(8)
    table.enter()
    table.lookup(paths, range(8 + table.group_size))  # group_size set aside while this read runs
    entered = threading.Event()

    def later() -> None:
        table.enter()
        entered.set()
        table.leave()

    waiter = threading.Thread(target=later)
    waiter.start()
    assert not entered.wait(0.3)  # waits for the read in flight
    table.leave()  # the set-aside descriptors close; the waiting read goes on
    assert entered.wait(10)
    waiter.join(10)
    table.close_all()


def test_a_file_that_cannot_be_opened_leaves_no_read_held(tmp_path: Path) -> None:
    table = Descriptors(4)
    table.enter()
    with pytest.raises(FileNotFoundError) as info:
        table.lookup([str(tmp_path / "missing")], [0])
    table.leave()
    assert info.value.filename == str(tmp_path / "missing")
    with table.held(files(tmp_path, 1), [0]) as fds:
        assert is_open(fds[0])
    table.close_all()


def test_the_budget_follows_the_soft_limit_on_open_files(monkeypatch: pytest.MonkeyPatch) -> None:
    resource = pytest.importorskip("resource")
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    assert open_files_budget() == 64
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20, 4096))
    assert open_files_budget() == 8
    monkeypatch.setenv("NAIAD_MAX_OPEN_FILES", "100")
    assert open_files_budget() == 100
