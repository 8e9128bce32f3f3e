"""The readers' options (NOTE [ Reader options ] in sources/options.py): each reader takes at most
eight keywords; the bad rows policy, the storage, the media access and CSV's parse options are
one value each; and every keyword of the release before still works, warning with its new
spelling."""

from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import naiad
from naiad import sources
from naiad.errors import ConfigError
from naiad.sources import (
    CsvFormat,
    MediaAccess,
    RetryPolicy,
    SkipBadRows,
    Source,
    SourceTraits,
    Storage,
)
from tests.conftest_stream import open_numbered, write_numbered

READERS = {
    "read_csv": naiad.read_csv, "read_jsonl": naiad.read_jsonl, "read_text": naiad.read_text,
    "read_parquet": naiad.read_parquet, "read_arrow": naiad.read_arrow, "read_npy": naiad.read_npy,
    "read_webdataset": naiad.read_webdataset, "read_images": naiad.read_images, "read_tokens": naiad.read_tokens,
}


def keywords(reader: Any) -> list[str]:
    """A reader's named keywords: every parameter but its paths and the old keywords' catch-all."""
    params = list(inspect.signature(reader).parameters.values())[1:]
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_reader_takes_at_most_eight_keywords(name: str) -> None:
    assert len(keywords(READERS[name])) <= 8, keywords(READERS[name])


def test_the_shared_options_have_one_spelling() -> None:
    for name, reader in READERS.items():
        kw = keywords(reader)
        assert "storage" in kw
        assert "on_bad_rows" in kw or name == "read_tokens"
        assert not {"storage_options", "retry", "cache_dir", "cache_bytes", "max_bad_rows", "media_roots",
                    "max_media_bytes", "delimiter", "header"} & set(kw), name
    assert "media" in keywords(naiad.read_parquet) and "media" in keywords(naiad.read_arrow)
    assert "media" in keywords(naiad.read_images) and "csv" in keywords(naiad.read_csv)


def test_each_reader_is_its_source_class_with_one_docstring() -> None:
    for name, reader in READERS.items():
        if name == "read_tokens":
            continue
        assert isinstance(reader, type) and issubclass(reader, Source), name
        assert reader.reader_name == name and reader.__doc__ and f"naiad.{name}" in reader.__doc__


# -- the old keywords, for a release --------------------------------------------------------


def deprecated(match: str) -> Any:
    return pytest.warns(DeprecationWarning, match=match)


def test_each_old_csv_keyword_still_works_and_warns(tmp_path: Path) -> None:
    p = tmp_path / "d.tsv"
    p.write_text("1\t'a\tb'\n2\tc\n")
    old = {"delimiter": "\t", "header": False, "column_names": ["n", "s"], "quote_char": "'", "compression": None}
    for name in old:
        with deprecated(rf"`{name}=` is now csv=naiad\.CsvFormat\({name}=\.\.\.\)"):
            src = naiad.read_csv(str(p), **{k: v for k, v in old.items() if k == name or k in ("delimiter", "header", "column_names")})
        assert getattr(src.csv, name) == (tuple(old[name]) if name == "column_names" else old[name])
    with deprecated("newlines_in_values"):
        src = naiad.read_csv(str(p), newlines_in_values=True, delimiter="\t", header=False)
    assert src.newlines_in_values and len(src.blocks()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        src = naiad.read_csv(str(p), **old)
    new = naiad.read_csv(str(p), csv=CsvFormat(delimiter="\t", header=False, column_names=("n", "s"), quote_char="'",
                                                   compression=None))
    assert src.read_block(src.blocks()[0]).columns["s"] == new.read_block(new.blocks()[0]).columns["s"] == ["a\tb", "c"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text", "parquet", "arrow", "npy"])
def test_each_old_storage_keyword_still_works_and_warns(tmp_path: Path, fmt: str) -> None:
    paths = write_numbered(str(tmp_path), fmt, [9])
    policy = RetryPolicy(attempts=2)
    for name, value in (("storage_options", {"anon": True}), ("retry", policy), ("cache_dir", str(tmp_path / "c")),
                        ("cache_bytes", 1 << 20)):
        extra = {"cache_dir": str(tmp_path / "c")} if name == "cache_bytes" else {}
        with deprecated(rf"`{name}=` is now storage=naiad\.Storage"):
            src = open_numbered(paths, fmt, **{name: value}, **extra)
        got = {"storage_options": src.storage.options, "retry": src.storage.retry, "cache_dir": src.storage.cache_dir,
               "cache_bytes": src.storage.cache_bytes}[name]
        assert got == (os.path.abspath(value) if name == "cache_dir" else value)
        assert len(src) == 9
    with pytest.raises(ConfigError, match="pass `storage=` alone"), deprecated("storage_options"):
        open_numbered(paths, fmt, storage=Storage(), storage_options={"anon": True})


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text", "parquet", "arrow", "npy"])
def test_the_old_max_bad_rows_still_works_and_warns(tmp_path: Path, fmt: str) -> None:
    paths = write_numbered(str(tmp_path), fmt, [9])
    with deprecated(r"`max_bad_rows=` is now on_bad_rows=naiad\.SkipBadRows\(max_rows=\.\.\.\)"):
        src = open_numbered(paths, fmt, on_bad_rows="skip", max_bad_rows=3)
    assert (src.on_bad_rows, src.max_bad_rows, src.bad_rows) == ("skip", 3, SkipBadRows(3))
    with pytest.raises(ConfigError, match="on_bad_rows='skip'"), deprecated("max_bad_rows"):
        open_numbered(paths, fmt, max_bad_rows=3)
    with pytest.raises(ConfigError, match="alone"), deprecated("max_bad_rows"):
        open_numbered(paths, fmt, on_bad_rows=SkipBadRows(2), max_bad_rows=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old keyword given None says nothing: no warning
        assert open_numbered(paths, fmt, max_bad_rows=None, storage_options=None).on_bad_rows == "raise"


def test_old_keywords_of_read_tokens_read_webdataset_images_and_read(tmp_path: Path) -> None:
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    with deprecated("cache_dir"):
        tokens = naiad.read_tokens(str(tmp_path / "t.bin"), seq_len=8, cache_dir=str(tmp_path / "c"))
    assert len(tokens) == 12
    paths = write_numbered(str(tmp_path), "csv", [5])
    with deprecated("storage_options"):
        src = naiad.read(paths, storage_options={"anon": True}, block_bytes=64)
    assert isinstance(src, sources.CsvSource) and src.storage.options == {"anon": True}
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"not really a png")
    with deprecated("max_bad_rows"):
        images = naiad.read_images(tmp_path / "img", on_bad_rows="skip", max_bad_rows=0.5, index_dir=False)
    assert images.max_bad_rows == 0.5
    for reader, args in ((naiad.read_csv, (paths,)), (naiad.read_tokens, (str(tmp_path / "t.bin"),)),
                         (naiad.read_images, (tmp_path / "img",))):
        kw = {"seq_len": 8} if reader is naiad.read_tokens else {}
        with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
            reader(*args, no_such_option=1, **kw)
    for gone in ("media_roots", "max_media_bytes"):  # never released: replaced, not deprecated
        with pytest.raises(TypeError, match=gone):
            naiad.read_images(tmp_path / "img", **{gone: 1}, index_dir=False)


# -- the new values -------------------------------------------------------------------------


def test_a_storage_is_copied_by_each_source_and_a_dict_is_its_options(tmp_path: Path) -> None:
    paths = write_numbered(str(tmp_path), "parquet", [4])
    shared = Storage({"anon": True}, RetryPolicy(attempts=3))
    a, b = naiad.read_parquet(paths, storage=shared), naiad.read_parquet(paths, storage=shared)
    assert a.storage is not shared and b.storage is not a.storage and shared.infos == {}
    assert a.storage.options == b.storage.options == {"anon": True} and a.storage.retry == RetryPolicy(attempts=3)
    assert naiad.read_parquet(paths, storage={"anon": True}).storage.options == {"anon": True}
    assert repr(Storage({"key": "secret-key", "secret": "s"})) == "Storage(options=['key', 'secret'])"  # names only


def test_a_tsv_read_through_naiad_read_keeps_its_tab_unless_the_format_names_another(tmp_path: Path) -> None:
    p = tmp_path / "d.tsv"
    p.write_text("1\t2\n3\t4\n")
    assert naiad.read(str(p), csv=CsvFormat(header=False)).column_names == ["f0", "f1"]
    assert naiad.read(str(p), csv=CsvFormat(header=False, delimiter=",")).column_names == ["f0"]
    assert naiad.read_csv(str(p), csv=CsvFormat(header=False)).column_names == ["f0"]  # read_csv: a comma
    with pytest.raises(ConfigError, match="`delimiter` must be one character"):
        CsvFormat(delimiter=";;")
    with pytest.raises(ConfigError, match="`csv` must be a naiad.CsvFormat"):
        naiad.read_csv(str(p), csv={"delimiter": "\t"})  # type: ignore[arg-type]


def test_skip_bad_rows_carries_its_limit(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("a\n1\nx\n2\n")
    src = naiad.read_csv(str(p), on_bad_rows=SkipBadRows(max_rows=0.25))
    assert (src.on_bad_rows, src.max_bad_rows) == ("skip", 0.25)
    assert naiad.read_csv(str(p), on_bad_rows="skip").bad_rows == SkipBadRows()
    assert naiad.read_csv(str(p)).bad_rows == "raise"
    with pytest.raises(ConfigError, match="`on_bad_rows` must be 'raise', 'skip' or naiad.SkipBadRows"):
        naiad.read_csv(str(p), on_bad_rows="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`max_rows` as a fraction must be between 0 and 1"):
        SkipBadRows(1.5)


def test_media_access_bounds_an_image_folder_and_refuses_roots(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "small.png").write_bytes(b"s" * 10)
    (tmp_path / "img" / "big.png").write_bytes(b"b" * 5000)
    src = naiad.read_images(tmp_path / "img", on_bad_rows="skip", media=MediaAccess(max_bytes=4096), index_dir=False)
    data = src.read_block(src.blocks()[0])
    assert data.columns["image"].tolist() == [b"s" * 10] and data.bad_rows == 1
    with pytest.raises(ConfigError, match="do not apply to an image folder"):
        naiad.read_images(tmp_path / "img", media=MediaAccess(roots=(str(tmp_path),)), index_dir=False)


def test_a_media_access_made_by_its_constructor_reads_as_one_made_by_of(tmp_path: Path) -> None:
    from naiad.sources.media import media_access

    made = media_access(MediaAccess(roots=("~/images/../images", "s3://bucket/a/./b"), max_bytes=100))  # type: ignore[arg-type]
    assert made == MediaAccess.of(["~/images/../images", "s3://bucket/a/./b"], 100)
    assert made.roots[0] == os.path.expanduser("~/images") and made.real_roots


# -- the traits -----------------------------------------------------------------------------


def test_each_reader_says_its_traits() -> None:
    assert naiad.read_csv.traits == SourceTraits(early_cut=True, keeps_parsed=True, line_numbers=True)
    assert naiad.read_parquet.traits == naiad.read_arrow.traits == SourceTraits(blocks_from_metadata=True)
    assert naiad.read_webdataset.traits == SourceTraits(early_cut=True, reads_before_count=True, keys_by_file=True)
    assert naiad.read_npy.traits == naiad.read_images.traits == SourceTraits()
    with pytest.raises(ConfigError, match="needs early_cut=True"):
        SourceTraits(reads_before_count=True)


def test_a_format_with_the_old_class_flags_still_plans_by_them() -> None:
    with deprecated(r"traits = SourceTraits\(blocks_from_metadata=True, keeps_parsed=True\)"):
        class OldFormat(Source):
            blocks_from_metadata = True
            keeps_parsed = True

            def _read_schema(self) -> pa.Schema:
                return pa.schema([])

            def _file_blocks(self, path: str) -> list[sources.Block]:
                return []

            def _read(self, block: sources.Block, lo: int, hi: int, use_threads: bool) -> sources.BlockData:
                return sources.BlockData({})

    assert OldFormat.traits == SourceTraits(blocks_from_metadata=True, keeps_parsed=True)
