"""The readers of samples and tokens, fed damaged headers, end in the right data or a naiad error
that names the file (or the sample): never another exception type, a hang, a crash of the
interpreter, a read outside the data's folder, or memory out of proportion to the data.

* tar shards written by ``tarfile`` (ustar, GNU, pax) and ``webdataset.TarWriter``, damaged in a
  header field, a pax record or a GNU long name, or cut short: what ``tarfile`` reads in them (a
  reference that borrows nothing of naiad's), or a SourceError naming the shard; the same read
  with a kept member index and by 2 process workers;
* the indexes and listings naiad keeps (``.npz`` member indexes of tar shards, image folders'
  listings, JSON block indexes of CSV and JSONL) damaged or rewritten: the right samples, or a
  lie that passes every check and reads only the data's own files (docs/SECURITY.md);
* Parquet tables whose ``{bytes, path}`` column names files by hostile paths, local and on
  fsspec's ``memory://``: each row its bytes, a file inside the table's folder, or a bad row;
* images (PNG, JPEG, GIF, BMP, WebP) and clips (WAV, FLAC) with damaged dimensions, rates,
  counts and lengths: pixels or samples of the right shape, or a DecodeError naming the sample;
* token files (``.npy`` headers, modded-nanogpt shard headers, flat ``.bin`` sizes): the windows
  NumPy reads in them, or a SourceError naming the file.

The rules and the damage are in the ``samples`` package, a module a kind of input; the peak
memory of a batch of cases is measured in a child process (NOTE [ Memory runner ] in
``samples/runner.py``). Cases that once failed are kept in ``corpus_samples/<kind>/`` and read on
every run, and each bug they found has a test of its own at the end of this file.

The fuzzers draw a fixed sequence of cases (hypothesis, derandomized). A longer run draws more:
``NAIAD_FUZZ_EXAMPLES=2000 python -m pytest tests/fuzz/test_fuzz_samples.py`` runs 2,000
examples of every fuzz test (and as many cases of each kind in the memory runner), with
timeouts scaled to match.
"""

from __future__ import annotations

import glob
import io
import json
import os
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naiad
from naiad.errors import SourceError
from tests.fuzz import samples
from tests.helpers import run_to_end

pytest.importorskip("PIL.Image", reason="the image fuzzers write images with Pillow (pip install 'naiad[test]')")
pytest.importorskip("soundfile", reason="the audio fuzzers write clips with soundfile (pip install 'naiad[test]')")
pytest.importorskip("webdataset", reason="the tar fuzzers write shards with webdataset (pip install 'naiad[test]')")

EXAMPLES = int(os.environ.get("NAIAD_FUZZ_EXAMPLES", "0") or 0)
"""Examples of every fuzz test (0: each test's own count, a few minutes in all)."""

CORPUS = os.path.join(os.path.dirname(__file__), "corpus_samples")
# Pillow warns of any image over its limit as it opens it, before the decode's budget refuses it.
pytestmark = [pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")]
MEMORY_MB = 300
"""The most a batch of cases may raise a process's peak resident memory by."""


def fuzz(examples: int) -> settings:
    return settings(max_examples=EXAMPLES or examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def timeout(seconds: float, examples: int = 1) -> pytest.MarkDecorator:
    """``seconds`` for ``examples`` examples, scaled to a longer run's."""
    return pytest.mark.timeout(int(seconds * max(1.0, EXAMPLES / examples)) if EXAMPLES else int(seconds))


class Drawn:
    """A case's choices (``samples.Pick``) drawn by hypothesis, so a failure shrinks and prints."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def choice(self, seq: Any) -> Any:
        return self.data.draw(st.sampled_from(seq))

    def random(self) -> float:
        return self.data.draw(st.floats(0, 1, exclude_max=True))

    def randrange(self, start: int, stop: int) -> int:
        return self.data.draw(st.integers(start, stop - 1))


def run(case: Callable[..., None], data: st.DataObject, **kwargs: Any) -> None:
    """One drawn case in a fresh folder."""
    with tempfile.TemporaryDirectory() as folder:
        case(Drawn(data), folder, **kwargs)


# -- the fuzzers --------------------------------------------------------------------------------


@timeout(90, 1200)
@fuzz(1200)
@given(data=st.data())
def test_damaged_tar_header_reads_as_tarfile_or_names_the_shard(data: st.DataObject) -> None:
    run(samples.tar_case, data)


@timeout(90, 30)
@fuzz(30)
@given(data=st.data())
def test_damaged_tar_reads_the_same_with_a_kept_index_and_process_workers(data: st.DataObject) -> None:
    run(samples.tar_case, data, kept=True, workers=True)


@timeout(90, 300)
@fuzz(300)
@given(data=st.data())
def test_damaged_kept_member_index_is_walked_again(data: st.DataObject) -> None:
    run(samples.kept_index_case, data)


@timeout(90, 300)
@fuzz(300)
@given(data=st.data())
def test_damaged_kept_listing_is_listed_again(data: st.DataObject) -> None:
    run(samples.listing_case, data)


@timeout(90, 200)
@fuzz(200)
@given(data=st.data())
def test_damaged_block_index_is_scanned_again(data: st.DataObject) -> None:
    run(samples.block_index_case, data)


@timeout(90, 400)
@fuzz(400)
@given(data=st.data())
def test_media_paths_of_a_local_table_stay_in_its_folder(data: st.DataObject) -> None:
    run(samples.table_case, data, remote=False)


@timeout(90, 400)
@fuzz(400)
@given(data=st.data())
def test_media_paths_of_a_remote_table_stay_in_its_folder(data: st.DataObject) -> None:
    run(samples.table_case, data, remote=True)


@timeout(90, 1500)
@fuzz(1500)
@given(data=st.data())
def test_damaged_image_header_decodes_or_names_the_sample(data: st.DataObject) -> None:
    run(samples.image_case, data)


@timeout(90, 1200)
@fuzz(1200)
@given(data=st.data())
def test_damaged_audio_header_decodes_or_names_the_sample(data: st.DataObject) -> None:
    run(samples.audio_case, data)


@timeout(90, 800)
@fuzz(800)
@given(data=st.data())
def test_damaged_token_file_gives_numpys_windows_or_names_the_file(data: st.DataObject) -> None:
    run(samples.token_case, data)


@timeout(90, 15)
@fuzz(15)
@given(data=st.data())
def test_damaged_token_file_reads_the_same_by_process_workers(data: st.DataObject) -> None:
    run(samples.token_case, data, workers=True)


def test_undamaged_seeds_read_whole(tmp_path: Path) -> None:
    # The fuzzers start from these: each must read whole (or the fuzzing proves little).
    for writer in samples.TAR_WRITERS:
        for names in samples.TAR_NAMES:
            data = samples.tar_shard(writer, names)
            path = str(tmp_path / f"{writer}-{names}.tar")
            samples.write_file(path, data)
            got = samples.read_shards([path])
            expected = samples.reference_samples(data)
            assert got is not None and expected is not None and samples.same_samples(got, expected), (writer, names)
            assert [v for _, v in got] == [samples.member_bytes(0, i) for i in range(6)], (writer, names)
    for fmt in samples.IMAGE_FORMATS:
        for crop, size in (("center", 32), ("random", 32), (None, None)):
            assert samples.decode_image(samples.image_seed(fmt), crop=crop, size=size) is not None, (fmt, crop)
        assert samples.decode_image(samples.image_seed(fmt), size=None) == (3, 12, 20), fmt
    for fmt in samples.AUDIO_FORMATS:
        assert samples.decode_clip(samples.audio_seed(fmt)) == 4000, fmt  # 0.25 s at 16 kHz
        assert samples.decode_clip(samples.audio_seed(fmt), seconds=1.0) == 16_000, fmt
    for layout in ("npy", "shard", "bin"):
        path = samples.write_file(str(tmp_path / f"tokens-{layout}"), samples.token_seed(layout))
        got = samples.read_windows(path)
        assert got is not None and np.array_equal(got, samples.reference_windows(samples.token_seed(layout))), layout
        assert got.shape == ((samples.TOKENS - 1) // 8, 9), layout


# -- the corpus ---------------------------------------------------------------------------------

IMAGE_ROWS = {"webp_lossless_16384x1024.webp": 8}


def corpus(kind: str) -> list[Any]:
    """The corpus files of ``kind``: cases that once broke a rule, kept so none ever does again."""
    return [pytest.param(path, id=f"{kind}/{os.path.basename(path)}")
            for path in sorted(glob.glob(os.path.join(CORPUS, kind, "*")))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", corpus("tar"))
def test_corpus_shard_reads_as_tarfile_or_names_the_shard(path: str, tmp_path: Path) -> None:
    from tests.helpers import child_pids, shm_entries

    with open(path, "rb") as f:
        data = f.read()
    shard = samples.write_file(str(tmp_path / "s.tar"), data)
    got, expected = samples.read_shards([shard]), samples.reference_samples(data)
    assert got is None or (expected is not None and samples.same_samples(got, expected))
    assert samples.read_shards([shard], index_dir=str(tmp_path / "index")) == got
    assert samples.read_shards([shard], index_dir=str(tmp_path / "index")) == got
    pids, shm = child_pids(), shm_entries()
    assert samples.read_shards([shard], num_workers=2) == got
    samples.settled(pids, shm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", corpus("kept"))
def test_corpus_kept_file_damage_gives_the_right_samples(path: str, tmp_path: Path) -> None:
    with open(path) as f:
        samples.replay_kept(json.load(f), str(tmp_path))


def measured(args: list[str], timeout_s: float) -> dict[str, Any]:
    """What the memory runner (``python -m tests.fuzz.samples.runner ARGS``, a child) reports."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = run_to_end([sys.executable, "-m", "tests.fuzz.samples.runner", *args], timeout_s=timeout_s, env=env, cwd=root)
    assert done.returncode == 0, f"the runner ended with {done.returncode} (a crash?): {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", corpus("image"))
def test_corpus_image_decodes_within_the_memory_bound(path: str) -> None:
    report = measured(["--images", str(IMAGE_ROWS.get(os.path.basename(path), 1)), path], timeout_s=80)
    assert not report["failures"], report["failures"]
    assert report["growth_mb"] < MEMORY_MB, f"the peak resident memory grew by {report['growth_mb']} MB"


# -- memory -------------------------------------------------------------------------------------


@timeout(150, 60)
def test_a_batch_of_damaged_files_of_every_kind_stays_within_the_memory_bound() -> None:
    # Every kind's cases in one child, after a warm-up of each reader: the peak may grow by
    # at most MEMORY_MB, whatever the damage claims, and no rule may break.
    cases = EXAMPLES or 60
    report = measured(["all", str(cases), "20240520"], timeout_s=140 * max(1.0, cases / 60))
    assert not report["failures"], report["failures"]
    assert report["cases"] >= len(samples.CASES) * cases // 2, report
    assert report["growth_mb"] < MEMORY_MB, f"the peak resident memory grew by {report['growth_mb']} MB: {report['by_kind']}"


# -- what the fuzzers found, each held by a test of its own -------------------------------------


@pytest.mark.timeout(60)
def test_a_flipped_bit_in_a_large_kept_member_index_is_not_used(tmp_path: Path) -> None:
    # 9,000 samples: the index's sizes array is 72 KB, more than a read of its header takes, so
    # only its checksum can tell that a bit of it flipped (the links and prefixes the fuzzers
    # found are held by tests/integration/test_trust_paths.py).
    path = str(tmp_path / "big.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(9000):
            info = tarfile.TarInfo(f"k{i:05d}.bin")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"%05d" % i))
    expected = samples.read_shards([path])
    assert expected is not None and samples.read_shards([path], index_dir=str(tmp_path / "index")) == expected
    kept = samples.the_kept_file(str(tmp_path / "index"))
    data = bytearray(Path(kept).read_bytes())
    member = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("sizes.npy")
    local = data[member.header_offset:member.header_offset + 30]  # its name and extra field as the local header has them
    start = member.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    data[start + member.file_size - 8 * 100] ^= 0x04  # sample 8,900: 5 bytes become 1
    Path(kept).write_bytes(bytes(data))
    assert samples.read_shards([path], index_dir=str(tmp_path / "index")) == expected


def test_a_path_that_is_not_utf8_fails_the_table_naming_it(tmp_path: Path) -> None:
    # Arrow checks a string column chunk whole: one path that is not UTF-8 makes the chunk
    # unreadable, so the whole table is a SourceError naming it, with on_bad_rows="skip" too.
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "0.png").write_bytes(b"IMG0")
    paths = pa.array([b"img/0.png", b"img/\xff\xfe.png"], pa.binary()).view(pa.string())
    column = pa.StructArray.from_arrays([pa.array([None, None], pa.binary()), paths], ["bytes", "path"])
    pq.write_table(pa.table({"image": column}), tmp_path / "t.parquet")
    for skip in ("raise", "skip"):
        with pytest.raises(SourceError, match="t.parquet"):
            list(naiad.DataLoader(naiad.read_parquet(tmp_path / "t.parquet", on_bad_rows=skip), batch_size=8))
