"""``naiad convert SRC DST``: any file naiad reads to Parquet or Arrow IPC shards for streaming,
and samples (an image folder, tar shards, Parquet with images) to WebDataset tar shards or to
Parquet that Hugging Face ``datasets`` reads.

    naiad convert "raw/*.csv" data/train.parquet --rows-per-shard 1000000 --shuffle --seed 1
    naiad convert s3://bucket/raw/train.jsonl s3://bucket/train/ --format arrow --dtypes float32
    naiad convert photos/ shards/train.tar --rows-per-shard 5000 --max-size 512 --shuffle
    naiad convert fashion/ data/fashion.parquet --decode
    naiad convert "corpus/*.jsonl" tokens/ --tokenize tokenizer.json --tokens-per-shard 100000000
    naiad convert ucf101/train/ shards/train.tar --keyframe-interval 16 --max-size 256 --shuffle
    naiad convert s3://bucket/ucf101/train/ shards/train.tar --storage-options '{"anon": true}'

Row groups sized for block shuffling, float columns without dictionary pages, an optional
seeded global permutation in bounded memory, a manifest of row counts and SHA-256 checksums;
every shard appears only once whole. With ``--tokenize``, text becomes token shards that
``naiad.read_tokens`` reads (NOTE [ Token shards ] in tools/convert_tokens.py). A video folder
(or a prefix, URL glob or list of URLs behind one) becomes WebDataset tar shards of ``.mp4`` and ``.cls`` members, optionally re-encoded (NOTE [
Video shards ] in tools/convert_video.py; docs/VIDEO.md). docs/CONVERT.md.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from naiad.cli.argtypes import at_least

NAME = "convert"
HELP = ("Convert CSV, JSONL, text, Parquet, Arrow or .npy files (local or URLs) to Parquet or Arrow shards; "
        "image folders, tar shards or Parquet with images to WebDataset tar shards or Parquet; video folders to "
        "WebDataset tar shards, optionally re-encoded.")

_SIZE_RE = re.compile(r"^\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"512M"``, ``"1e9"`` -> bytes (powers of 1024 for K, M, G, T)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GiB or 512MiB, got {text!r}")
    value = float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    return int(value)


def parse_dtypes(text: str) -> dict[str, str] | str:
    """``"float32"`` (every numeric column) or ``"x=float32,y=int64"`` (per column)."""
    if "=" not in text:
        return text.strip()
    out = {}
    for item in text.split(","):
        name, sep, dtype = item.partition("=")
        if not sep or not name.strip() or not dtype.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=DTYPE[,NAME=DTYPE...] or one DTYPE, got {text!r}")
        out[name.strip()] = dtype.strip()
    return out


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (storage options)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad convert`` options to ``parser``."""
    parser.add_argument("src", help="a file, glob or URL (s3://..., gs://...) of one format naiad reads, a folder "
                        "of images, or a folder (or glob) of videos, local or a URL (s3://bucket/ucf101/train/)")
    parser.add_argument("dst", help="an output file (out/train.parquet, out/train.tar) or folder (out/, s3://bucket/train/)")
    parser.add_argument("--format", choices=("parquet", "arrow", "webdataset"), default=None,
                        help="output format (default: from DST's suffix, .tar is webdataset; else parquet)")
    parser.add_argument("--rows-per-shard", "--samples-per-shard", type=at_least(1), default=None,
                        help="rows (samples) per output file, numbered NAME-00000 (default: one file)")
    parser.add_argument("--row-group-rows", type=at_least(1), default=None,
                        help="rows per row group / record batch, the streaming block (default: 1/4096 of the "
                        "rows, between 1,024 and 65,536)")
    parser.add_argument("--shuffle", action="store_true", help="write the rows in a seeded global permutation")
    parser.add_argument("--seed", type=int, default=0, help="the permutation's seed (default 0)")
    parser.add_argument("--memory", type=parse_size, default=1 << 30, metavar="SIZE",
                        help="memory a shuffle may use, e.g. 4GiB (default 1GiB; about half is used)")
    parser.add_argument("--tmp-dir", default=None, help="where a shuffle's temporary files go (default: beside DST)")
    parser.add_argument("--columns", type=lambda s: [c.strip() for c in s.split(",") if c.strip()], default=None,
                        help="keep these columns, comma-separated")
    parser.add_argument("--dtypes", type=parse_dtypes, default=None,
                        help="column types: x=float32,y=int64, or one type for every numeric column")
    parser.add_argument("--on-bad-rows", choices=("raise", "skip"), default="raise",
                        help="a bad row stops the convert naming its file and line (raise, default) or is "
                        "skipped and counted (skip)")
    parser.add_argument("--compression", default=None,
                        help="codec: snappy (Parquet's default), zstd, gzip, lz4, none (Arrow's default)")
    parser.add_argument("--max-size", type=at_least(1), default=None, metavar="PIXELS",
                        help="samples: images whose longer side exceeds PIXELS are made smaller and encoded again "
                        "(JPEG stays JPEG at --quality; others become PNG); videos: those whose SHORTER side exceeds "
                        "PIXELS are re-encoded to H.264 that small")
    parser.add_argument("--keyframe-interval", type=at_least(1), default=None, metavar="FRAMES",
                        help="videos: re-encode every video to H.264 with a keyframe every FRAMES frames (about a "
                        "clip's span or a second: a clip then decodes few frames it drops)")
    parser.add_argument("--crf", type=at_least(0), default=23,
                        help="videos: the H.264 quality of a re-encode, x264's CRF (default 23; lower is better, larger)")
    parser.add_argument("--shard-size", type=parse_size, default=None, metavar="SIZE",
                        help="videos: the most bytes a tar shard holds, e.g. 512MiB (default 1GiB); shards are "
                        "numbered NAME-00000.tar")
    parser.add_argument("--quality", type=at_least(1), default=90, help="JPEG quality of images made smaller (default 90)")
    parser.add_argument("--decode", action="store_true",
                        help="samples: store images decoded, uint8 pixels naiad reads back as [B, C, H, W] "
                        "(small images of one size; Parquet or Arrow)")
    parser.add_argument("--mode", choices=("L", "RGB", "RGBA"), default=None,
                        help="with --decode: the channels stored (default: from the first image)")
    parser.add_argument("--tokenize", default=None, metavar="TOKENIZER_JSON",
                        help="text: tokenize each document with this tokenizer.json and write token shards "
                        "(.npy, uint16 or uint32, document offsets, a manifest) that naiad.read_tokens reads; DST "
                        "is a folder")
    parser.add_argument("--text-column", default="text", help="with --tokenize: the text column (default text)")
    parser.add_argument("--eos-id", type=at_least(0), default=None,
                        help="with --tokenize: the end-of-document token (default: the tokenizer's <|endoftext|>, "
                        "</s>, ...)")
    parser.add_argument("--tokens-per-shard", type=at_least(1), default=None,
                        help="with --tokenize: tokens per shard, cut at a document's end (default: one shard)")
    parser.add_argument("--overwrite", action="store_true", help="replace shards and a manifest already at DST")
    parser.add_argument("--storage-options", type=parse_json_object, default=None, metavar="JSON",
                        help='fsspec options for URLs (SRC, and DST unless --output-storage-options), e.g. '
                        '\'{"endpoint_url": "http://...", "anon": true}\'')
    parser.add_argument("--output-storage-options", type=parse_json_object, default=None, metavar="JSON",
                        help="fsspec options for DST when they differ from --storage-options")
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary line")


def run(args: argparse.Namespace) -> int:
    """Run ``naiad convert``; prints one summary line."""
    from naiad.tools.convert import ConvertOptions, convert
    from naiad.tools.progress import Progress, human_bytes
    from naiad.tools.video_files import is_video_source

    if is_video_source(args.src):
        return _run_videos(args)
    _refuse_video_options(args)
    if args.tokenize is not None:
        return _run_tokenize(args)

    options = ConvertOptions(
        format=args.format, rows_per_shard=args.rows_per_shard, row_group_rows=args.row_group_rows,
        shuffle=args.shuffle, seed=args.seed, memory_bytes=args.memory, columns=args.columns,
        dtypes=args.dtypes, on_bad_rows=args.on_bad_rows, compression=args.compression,
        overwrite=args.overwrite, storage_options=args.storage_options,
        output_storage_options=args.output_storage_options, tmp_dir=args.tmp_dir,
        max_size=args.max_size, quality=args.quality, decode=args.decode, mode=args.mode,
    )
    labels = {"convert": "converting", "scatter": "pass 1/2 scatter", "write": "pass 2/2 write"}
    progress = Progress(enabled=False if args.quiet else None, labels=labels)
    try:
        result = convert(args.src, args.dst, options, progress=progress)
    finally:
        progress.close()
    if not args.quiet:
        size = sum(s.bytes for s in result.shards)
        rate = result.rows / result.seconds if result.seconds > 0 else 0.0
        skipped = f"; {result.bad_rows:,} bad row(s) skipped" if result.bad_rows else ""
        unit = "samples" if "samples" in result.manifest else "rows"
        print(f"naiad convert: {result.rows:,} {unit} -> {len(result.shards)} shard(s), {human_bytes(size)}, "
              f"in {result.seconds:.1f} s ({rate:,.0f} {unit}/s){skipped}; manifest {result.manifest_path}")
    return 0


def _run_tokenize(args: argparse.Namespace) -> int:
    from naiad.tokens.text import tokenize
    from naiad.tools.convert import ConvertOptions, open_source
    from naiad.tools.convert_tokens import convert_tokens
    from naiad.tools.progress import Progress, human_bytes

    t = tokenize(args.tokenize, args.text_column, seq_len=1, eos_id=args.eos_id)
    source = open_source(args.src, ConvertOptions(on_bad_rows=args.on_bad_rows, storage_options=args.storage_options))
    progress = Progress(enabled=False if args.quiet else None, labels={"convert": "tokenizing"})
    try:
        manifest = convert_tokens(source, args.dst, t, tokens_per_shard=args.tokens_per_shard,
                                  overwrite=args.overwrite, tokenizer_path=args.tokenize, progress=progress)
    finally:
        progress.close()
    if not args.quiet:
        size = sum(s["bytes"] for s in manifest["shards"])
        rate = manifest["tokens"] / manifest["seconds"] if manifest["seconds"] > 0 else 0.0
        print(f"naiad convert: {manifest['documents']:,} documents -> {manifest['tokens']:,} {manifest['dtype']} tokens "
              f"in {len(manifest['shards'])} shard(s), {human_bytes(size)}, in {manifest['seconds']:.1f} s "
              f"({rate:,.0f} tokens/s); manifest {args.dst.rstrip('/')}/manifest.json")
    return 0


# Options of the table and image converts that a video convert does not take, and their flags.
_NOT_FOR_VIDEOS = {"row_group_rows": "--row-group-rows", "columns": "--columns", "dtypes": "--dtypes",
                   "compression": "--compression", "tokenize": "--tokenize", "mode": "--mode", "tmp_dir": "--tmp-dir"}


def _refuse_video_options(args: argparse.Namespace) -> None:
    """A video option given for a source that is not videos is a mistake: say so."""
    from naiad.errors import ConfigError

    given = [flag for name, flag in (("keyframe_interval", "--keyframe-interval"), ("shard_size", "--shard-size"))
             if getattr(args, name) is not None]
    if args.crf != 23:
        given.append("--crf")
    if given:
        raise ConfigError(f"{', '.join(given)} apply to videos, and {args.src!r} is not a video folder, glob or file "
                          "(extensions .mp4, .avi, .mkv, .webm, ...).")


def _run_videos(args: argparse.Namespace) -> int:
    """``naiad convert`` of a video folder to tar shards (tools/convert_video.py)."""
    from naiad.errors import ConfigError
    from naiad.tools.convert_video import VideoConvertOptions, convert_videos
    from naiad.tools.progress import Progress, human_bytes

    given = [flag for name, flag in _NOT_FOR_VIDEOS.items() if getattr(args, name) not in (None, False)]
    given += ["--decode"] if args.decode else []
    if args.format not in (None, "webdataset"):
        given.append(f"--format {args.format}")
    if given:
        raise ConfigError(f"{', '.join(given)} do(es) not apply to videos, which convert to WebDataset tar shards "
                          "(--keyframe-interval, --max-size, --crf, --shard-size, --samples-per-shard, --shuffle).")
    options = VideoConvertOptions(
        keyframe_interval=args.keyframe_interval, max_size=args.max_size, crf=args.crf,
        shard_bytes=args.shard_size if args.shard_size is not None else 1 << 30, samples_per_shard=args.rows_per_shard,
        shuffle=args.shuffle, seed=args.seed, on_bad_rows=args.on_bad_rows, overwrite=args.overwrite,
        storage_options=args.output_storage_options if args.output_storage_options is not None else args.storage_options)
    progress = Progress(enabled=False if args.quiet else None, labels={"convert": "converting videos"})
    try:
        result = convert_videos(args.src, args.dst, options, progress=progress, storage=args.storage_options)
    finally:
        progress.close()
    if not args.quiet:
        size = sum(s.bytes for s in result.shards)
        s = result.manifest["samples"]
        skipped = f"; {result.bad_rows:,} bad video(s) skipped" if result.bad_rows else ""
        print(f"naiad convert: {result.rows:,} videos ({s['reencoded']:,} re-encoded, {s['copied']:,} copied) -> "
              f"{len(result.shards)} shard(s), {human_bytes(size)}, in {result.seconds:.1f} s{skipped}; manifest "
              f"{result.manifest_path}")
    return 0
