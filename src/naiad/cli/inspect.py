"""``naiad inspect PATH|URL|GLOB``: files, format, columns with naiad's types, rows, blocks, the
first rows, and a shuffled epoch's read time estimated from a short timed read; for samples (tar
shards, an image folder, Parquet with images) also keys, extensions, image sizes and formats and
the decode time per image, with what would stream faster.

    naiad inspect "data/*.parquet"
    naiad inspect s3://bucket/train.csv --storage-options '{"anon": true}' --json
    naiad inspect "shards/train-{0000..0099}.tar"
    naiad inspect photos/
    naiad inspect tokens/ --seq-len 1024            # token files: tokens, documents, windows
    naiad inspect ucf101/train/ --videos 16         # videos: codec, size, fps, keyframes, decode time per clip
    naiad inspect s3://bucket/ucf101/train/ --storage-options '{"anon": true}'   # a folder of videos behind a URL
    naiad inspect "shards/train-{0000..0099}.tar"   # .mp4 members (or a Parquet column of videos): the same

docs/CONVERT.md; videos: docs/VIDEO.md.
"""

from __future__ import annotations

import argparse

from naiad.cli.argtypes import at_least
from naiad.cli.convert import parse_json_object

NAME = "inspect"
HELP = ("Show what naiad sees in some files (format, columns, rows, blocks, first rows; for samples keys, "
        "extensions, image sizes, decode time; for videos codec, size, fps, keyframe interval, decode time per "
        "clip) and time a shuffled read.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad inspect`` options to ``parser``."""
    parser.add_argument("source", help="a file, glob or URL (read with naiad.read: the reader by suffix), a folder "
                        "of images, or a video file, glob or folder of videos, local or a URL (naiad.read_videos; a folder behind a "
                        "URL, s3://bucket/train/, is read as videos); tar shards or a "
                        "table holding videos report them as a folder's")
    parser.add_argument("--json", action="store_true", help="print the report as JSON, for scripts")
    parser.add_argument("--rows", type=at_least(0), default=5, help="first rows to show (default 5)")
    parser.add_argument("--time-budget", type=at_least(0, float), default=1.0, metavar="SECONDS",
                        help="how long the timed read of random blocks may take (default 1 s; 0: one block)")
    parser.add_argument("--max-blocks", type=at_least(0), default=256,
                        help="most blocks the timed read reads (default 256)")
    parser.add_argument("--images", type=at_least(0), default=64,
                        help="samples: how many random images to look at (headers; some decoded) (default 64)")
    parser.add_argument("--max-size", type=at_least(1), default=256, metavar="PIXELS",
                        help="samples: the size to time large images at, as `naiad convert --max-size` (default 256); "
                        "videos: the shorter side past twice which a smaller size is advised")
    parser.add_argument("--videos", type=at_least(1), default=8,
                        help="videos: how many to look at, spread over a folder, or read from shards or a table "
                        "(per column of videos) (default 8)")
    parser.add_argument("--frames", type=at_least(1), default=16,
                        help="videos: frames per clip timed, as naiad.decode_video's `frames` (default 16)")
    parser.add_argument("--stride", type=at_least(1), default=2,
                        help="videos: a clip takes every STRIDE-th frame, as naiad.decode_video's (default 2)")
    parser.add_argument("--seq-len", type=at_least(1), default=None,
                        help="read SOURCE as token files (naiad.read_tokens) and count its windows of this length "
                        "(token files are found without it from a .bin suffix or a token manifest; then 1024)")
    parser.add_argument("--dtype", default=None, help="token files: the dtype of flat .bin files (default uint16)")
    parser.add_argument("--eos-id", type=at_least(0), default=None,
                        help="token files: the end-of-document token, to count documents (default: the manifest's)")
    parser.add_argument("--storage-options", type=parse_json_object, default=None, metavar="JSON",
                        help='fsspec options for URLs, e.g. \'{"endpoint_url": "http://...", "anon": true}\'')


def run(args: argparse.Namespace) -> int:
    """Run ``naiad inspect``."""
    from naiad.tools.inspect_tokens import inspect_tokens, looks_like_tokens
    from naiad.tools.inspect_video_samples import VideoLook
    from naiad.tools.inspection import inspect_source
    from naiad.tools.video_files import is_video_source

    if is_video_source(args.source):
        from naiad.tools.inspect_video import inspect_videos

        videos = inspect_videos(args.source, videos=args.videos, frames=args.frames, stride=args.stride,
                                max_size=args.max_size, storage=args.storage_options)
        print(videos.to_json() if args.json else videos.summary())
        return 0
    if args.seq_len is not None or args.dtype is not None or args.eos_id is not None or looks_like_tokens(args.source):
        tokens = inspect_tokens(args.source, seq_len=args.seq_len or 1024, dtype=args.dtype, eos_id=args.eos_id,
                                storage=args.storage_options)
        print(tokens.to_json() if args.json else tokens.summary())
        return 0
    look = VideoLook(videos=args.videos, frames=args.frames, stride=args.stride)
    report = inspect_source(args.source, storage=args.storage_options, head_rows=args.rows,
                            time_budget_s=args.time_budget, max_blocks=max(1, args.max_blocks), images=args.images,
                            max_size=args.max_size, video=look)
    print(report.to_json() if args.json else report.summary())
    return 0
