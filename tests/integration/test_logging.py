"""What naiad says in its logs (docs/ARCHITECTURE.md, "Logging"): a tar member index walked, then
reused by the next source; a pass's skipped rows summarised; a retried remote call; a folder
listed, then its listing reused."""

from __future__ import annotations

import io
import logging
import tarfile
from pathlib import Path

import pytest

import naiad
from naiad.sources import SkipBadRows
from naiad.sources.retries import RetryPolicy, retrying

pytestmark = pytest.mark.timeout(120)


def _write_shards(folder: Path, count: int) -> list[str]:
    paths = []
    for k in range(count):
        path = folder / f"s{k}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(6):
                for ext, data in (("bin", bytes([i]) * 64), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"k{k}-{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def _messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_a_tar_index_is_walked_once_then_reused_by_the_next_source(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    paths = _write_shards(tmp_path, 3)
    caplog.set_level(logging.DEBUG, logger="naiad.index")
    first = naiad.read_webdataset(paths, index_dir=str(tmp_path / "idx"), extensions=["bin", "cls"])
    assert sum(len(b["cls"]) for b in naiad.DataLoader(first, batch_size=4)) == 18
    walked = [m for m in _messages(caplog, "naiad.index") if "member index" in m]
    assert len(walked) == 1 and "walked the member index of 3 of 3 tar shards" in walked[0], walked
    assert "none was kept" in walked[0]
    caplog.clear()
    again = naiad.read_webdataset(paths, index_dir=str(tmp_path / "idx"), extensions=["bin", "cls"])
    assert sum(len(b["cls"]) for b in naiad.DataLoader(again, batch_size=4)) == 18
    reused = [m for m in _messages(caplog, "naiad.index") if "member index" in m]
    assert len(reused) == 1 and "reused the kept member index of 3 tar shards" in reused[0], reused


def test_a_pass_summarises_its_skipped_rows_once_at_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bad.csv"
    bad = {6: "6,oops", 97: "97", 250: "250,x"}
    path.write_text("a,b\n" + "".join(f"{bad.get(i, f'{i},{i * 2}')}\n" for i in range(400)))
    caplog.set_level(logging.WARNING, logger="naiad.stream")
    loader = naiad.DataLoader(naiad.read_csv(path, on_bad_rows=SkipBadRows(), block_bytes=512), batch_size=16,
                              shuffle=True, seed=5, shuffle_buffer=48)
    assert sum(len(b["a"]) for b in loader) == 397
    summaries = [r for r in caplog.records if r.name == "naiad.stream" and "bad rows skipped" in r.getMessage()]
    assert len(summaries) == 1 and summaries[0].levelno == logging.WARNING
    message = summaries[0].getMessage()
    assert message.startswith("naiad: 3 bad rows skipped in epoch 0 (3 in the epoch); the first: ")
    assert "bad.csv (line " in message


def test_a_retried_remote_call_is_logged_with_its_attempt_and_error(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    caplog.set_level(logging.WARNING, logger="naiad.storage")
    assert retrying(RetryPolicy(attempts=5, base_s=0.0), "s3://bucket/key", (0, 10), flaky) == "ok"
    messages = _messages(caplog, "naiad.storage")
    assert len(messages) == 2
    assert messages[0].startswith("naiad: s3://bucket/key bytes 0-10 failed (attempt 1 of 5): ")
    assert "reset by peer" in messages[0] and "attempt 2 of 5" in messages[1]


def test_a_folder_is_listed_once_then_its_listing_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pil = pytest.importorskip("PIL.Image")
    for label in ("cat", "dog"):
        (tmp_path / "data" / label).mkdir(parents=True)
        for i in range(2):
            pil.new("L", (4, 4)).save(tmp_path / "data" / label / f"{i}.png")
    caplog.set_level(logging.DEBUG, logger="naiad.index")
    naiad.read_images(tmp_path / "data", index_dir=str(tmp_path / "idx"))
    assert any(m.startswith("naiad: listed ") and "4 files" in m and "none kept" in m
               for m in _messages(caplog, "naiad.index"))
    caplog.clear()
    naiad.read_images(tmp_path / "data", index_dir=str(tmp_path / "idx"))
    assert any(m.startswith("naiad: reused the kept listing of ") for m in _messages(caplog, "naiad.index"))
