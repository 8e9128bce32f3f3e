"""A persisted block index is data read back from disk, maybe written by someone else: a hostile
or stale entry is a cache miss (the file is scanned again and read right), never wrong rows, a
crash or a hang; and naiad writes entries only where it should (NOTE [ Block index ])."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naiad
from naiad.errors import SourceError
from naiad.sources.index import load_index

ROWS = 400
PARAMS = {"cut": "lines", "block_bytes": 256, "header_lines": 1, "keep_blank": False}


def _setup(folder: Path) -> tuple[Path, Path, Path, dict[str, Any]]:
    """A CSV, its index folder, the one entry in it, and the entry's JSON."""
    path = folder / "d.csv"
    path.write_text("id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(ROWS)))
    cache = folder / "cache"
    naiad.read_csv(path, block_bytes=256, index_dir=cache).blocks()
    (entry,) = cache.iterdir()
    return path, cache, entry, json.loads(entry.read_text())


def _ids(path: Path, cache: Path) -> list[int]:
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=256, index_dir=cache), batch_size=100)
    return np.concatenate([b["id"].numpy() for b in loader]).tolist()


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc.__setitem__(key, value)


def _item(key: str, i: int, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc[key].__setitem__(i, value)


def _swap_starts(doc: dict[str, Any]) -> None:
    doc["starts"][1], doc["starts"][2] = doc["starts"][2], doc["starts"][1]


HOSTILE = {
    "end past the file": lambda doc: doc.__setitem__("end", doc["end"] + 1),
    "end short of the file": lambda doc: doc.__setitem__("end", doc["end"] - 1),
    "starts descend": _swap_starts,
    "negative start": _item("starts", 0, -5),
    "negative rows": _item("rows", 1, -1),
    "more rows than bytes": _item("rows", 1, 10**6),
    "huge rows": _item("rows", 0, 10**30),
    "rows as float": _item("rows", 0, 12.0),
    "rows as string": _item("rows", 0, "12"),
    "rows as bool": _item("rows", 0, True),
    "line 0": _item("first_lines", 0, 0),
    "lines jump": _item("first_lines", 2, 10**9),
    "no blocks": lambda doc: doc.update(starts=[], rows=[], first_lines=[]),
    "lengths differ": lambda doc: doc["rows"].pop(),
    "a million starts": lambda doc: doc.__setitem__("starts", list(range(10**6))),
    "starts as dict": _set("starts", {"0": 1}),
    "size as string": lambda doc: doc.__setitem__("size", str(doc["size"])),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_entry_is_a_miss(tmp_path: Path, name: str) -> None:
    path, cache, entry, doc = _setup(tmp_path)
    HOSTILE[name](doc)
    entry.write_text(json.dumps(doc))
    assert load_index(cache, str(path), PARAMS) is None
    assert _ids(path, cache) == list(range(ROWS))


@pytest.mark.timeout(60)
def test_a_deeply_nested_entry_is_a_miss(tmp_path: Path) -> None:
    path, cache, entry, _ = _setup(tmp_path)
    entry.write_text("[" * 100_000 + "]" * 100_000)
    assert load_index(cache, str(path), PARAMS) is None
    assert _ids(path, cache) == list(range(ROWS))


@pytest.mark.parametrize("name", ["a block starts mid-line", "the header is a row"])
def test_a_forged_cut_is_scanned_again(tmp_path: Path, name: str) -> None:
    path, cache, entry, doc = _setup(tmp_path)
    true_starts = list(doc["starts"])
    if name == "the header is a row":
        doc["starts"][0], doc["rows"][0] = 0, doc["rows"][0] + 1
    else:
        doc["starts"][3] += 2  # inside a line: rows would be split in two
    entry.write_text(json.dumps(doc))
    assert load_index(cache, str(path), PARAMS) is not None  # plausible as data...
    assert _ids(path, cache) == list(range(ROWS))  # ...but the cut is checked against the file
    assert json.loads(entry.read_text())["starts"] == true_starts  # the scan wrote the true cut back


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["starts", "rows", "first_lines"]), i=st.integers(0, 100),
       value=st.one_of(st.integers(), st.integers(-3, 3)), shift=st.booleans())
def test_any_changed_number_is_a_miss_or_caught(tmp_path_factory: pytest.TempPathFactory, key: str, i: int,
                                                value: int, shift: bool) -> None:
    path, cache, entry, doc = _setup(tmp_path_factory.mktemp("idx"))
    i %= len(doc[key])
    doc[key][i] = doc[key][i] + value if shift else value
    entry.write_text(json.dumps(doc))
    try:
        got = _ids(path, cache)
    except SourceError as exc:
        # A row count that passes every check but is wrong is caught as the block is parsed.
        assert key == "rows" and "d.csv" in str(exc)
        return
    assert got == list(range(ROWS))


def test_entry_names_follow_the_path_not_the_content(tmp_path: Path) -> None:
    path, cache, entry, _ = _setup(tmp_path)
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(50)))  # new content, same path
    assert _ids(path, cache) == list(range(50))
    assert [p.name for p in cache.iterdir()] == [entry.name]  # replaced, under the same name


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_linked_index_folder_beside_the_data_is_not_written(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    (data / ".naiad-index").symlink_to(elsewhere)  # planted by someone who can write to data/
    path = data / "d.csv"
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(100)))
    assert len(naiad.read_csv(path, index_dir="beside")) == 100
    assert list(elsewhere.iterdir()) == []
