"""What naiad reads cannot run code, and what it writes goes through fresh temporary names
(docs/SECURITY.md): a pickled ``.npy`` is refused without being unpickled, and a link planted
at a predictable temporary name is never written through."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.cli.demo_data import diabetes_csv
from naiad.errors import SourceError
from naiad.telemetry import Telemetry


class _Payload:
    """Unpickling this creates a folder: the proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_pickled_npy_is_refused_unopened(tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    path = tmp_path / "objects.npy"
    np.save(path, np.array([_Payload(marker), 1], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match="objects.npy"):
        source = naiad.read_npy(str(path))
        list(naiad.DataLoader(source, batch_size=2))
    assert not marker.exists()


def test_a_pickled_npy_by_url_is_refused_unopened(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    marker = tmp_path / "pickle-ran"
    local = tmp_path / "objects.npy"
    np.save(local, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    url = "memory://naiad-security/objects.npy"
    with fsspec.open(url, "wb") as f:
        f.write(local.read_bytes())
    with pytest.raises(SourceError, match="object arrays"):
        list(naiad.DataLoader(naiad.read_npy(url), batch_size=1))
    assert not marker.exists()


def _plant(link: Path, victim: Path) -> None:
    victim.write_text("precious")
    link.symlink_to(victim)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_the_demo_csv_is_written_through_a_fresh_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(cache))
    victim = tmp_path / "victim"
    _plant(cache / f".diabetes-100-0.csv.{os.getpid()}.tmp", victim)  # the name it once used
    path = diabetes_csv(rows=100)
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and len(path.read_text().splitlines()) == 101
    assert sorted(p.name for p in cache.iterdir()) == sorted([path.name, f".diabetes-100-0.csv.{os.getpid()}.tmp"])


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_trace_is_written_through_a_fresh_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    _plant(tmp_path / "trace.json.tmp", victim)  # the name it once used
    tel = Telemetry()
    with tel.span("collate"):
        pass
    path = tel.export_chrome_trace(tmp_path / "trace.json")
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and "traceEvents" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json", "trace.json.tmp", "victim"]


def test_a_url_listing_cannot_leave_the_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    fsspec = pytest.importorskip("fsspec")
    from naiad.sources.storage import Storage

    fs = fsspec.filesystem("memory")
    fs.pipe("/naiad-glob/a/x.csv", b"id\n1\n")
    fs.pipe("/naiad-glob/other/y.csv", b"id\n2\n")
    storage = Storage()
    assert [u.replace(":///", "://") for u in storage.expand("memory://naiad-glob/a/*.csv")] == ["memory://naiad-glob/a/x.csv"]
    real_glob = type(fs).glob

    def hostile_glob(self: Any, path: str, **kw: Any) -> Any:  # a listing that names more than it was asked
        return {**real_glob(self, path, **kw), "/naiad-glob/other/y.csv": {"type": "file", "size": 5}}

    monkeypatch.setattr(type(fs), "glob", hostile_glob)
    with pytest.raises(SourceError, match="outside the pattern"):
        Storage().expand("memory://naiad-glob/a/*.csv")
