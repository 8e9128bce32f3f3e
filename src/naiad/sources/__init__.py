"""File formats: each reader is the lazy :class:`Source` class it returns, cut into blocks with
row counts.

``read_csv``, ``read_jsonl`` and ``read_text`` cut files into byte ranges of whole lines;
``read_parquet`` into row groups; ``read_arrow`` into record batches (``read_hf``: a Hugging Face
dataset's own Arrow files); ``read_npy`` into row
ranges of a memory-mapped array. Parsing is PyArrow's (or a NumPy memory map), a block at a time.
``read_webdataset`` (tar shards) and ``read_images`` (an image folder) read samples: byte ranges
of samples, runs of files (docs/SAMPLES.md). The options the readers share are values spelled
once (NOTE [ Reader options ] in options.py): :class:`Storage`, :class:`SkipBadRows`,
:class:`MediaAccess`, and CSV's :class:`CsvFormat`.
"""

from __future__ import annotations

from naiad.sources.arrow import ArrowSource, read_arrow
from naiad.sources.auto import read
from naiad.sources.base import Block, BlockData, Source
from naiad.sources.contract import SourceTraits
from naiad.sources.csv import CsvFormat, CsvSource, read_csv
from naiad.sources.hf import HFSource, read_hf
from naiad.sources.images import ImageFolderSource, read_images
from naiad.sources.jsonl import JsonlSource, read_jsonl
from naiad.sources.npy import NpySource, read_npy
from naiad.sources.options import SkipBadRows
from naiad.sources.parquet import ParquetSource, read_parquet
from naiad.sources.retries import RetryPolicy
from naiad.sources.storage import Storage
from naiad.sources.text import TextSource, read_text
from naiad.sources.videos import VideoFolderSource, read_videos
from naiad.sources.webdataset import WebDatasetSource, read_webdataset
from naiad.sources.wrapper import FormatWrapper
from naiad.trust.paths import MediaAccess

__all__ = [
    "ArrowSource",
    "Block",
    "BlockData",
    "CsvFormat",
    "CsvSource",
    "FormatWrapper",
    "HFSource",
    "ImageFolderSource",
    "JsonlSource",
    "MediaAccess",
    "NpySource",
    "ParquetSource",
    "RetryPolicy",
    "SkipBadRows",
    "Source",
    "SourceTraits",
    "Storage",
    "TextSource",
    "VideoFolderSource",
    "WebDatasetSource",
    "read",
    "read_arrow",
    "read_csv",
    "read_hf",
    "read_images",
    "read_jsonl",
    "read_npy",
    "read_parquet",
    "read_text",
    "read_videos",
    "read_webdataset",
]
