"""``naiad check``: prove a streaming configuration's coverage before a run, without reading a row.

Counts the source's rows (metadata for Parquet, Arrow and npy; a scan for newlines for CSV,
JSONL and text), dry-runs every rank's plan and shuffle buffer over row numbers, and checks that
every row is delivered exactly once per epoch across all ranks with the same number of steps on
every rank, also across a resume (elastic or not) at ``--resume-at``. Prints the total row count,
the batches per rank and the shuffle's quality; exits 1 with the reason when a check fails.

    naiad check "data/*.parquet" --world-size 64 --batch-size 256 --epochs 2
    naiad check train.csv --world-size 2 --batch-size 32 --resume-at 0.4 --new-world-size 3
"""

from __future__ import annotations

import argparse
import json
import sys

from naiad.cli.argtypes import at_least

NAME = "check"
HELP = "Dry-run a configuration's plan: every row once per epoch on every rank, also after a resume."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad check`` options to ``parser``."""
    parser.add_argument("source", help="a file or a glob (read with naiad.read: the reader by suffix)")
    parser.add_argument("--world-size", type=at_least(1), default=1, help="ranks (default 1)")
    parser.add_argument("--num-workers", type=at_least(0), default=0, help="workers per rank (default 0)")
    parser.add_argument("--batch-size", type=at_least(1), default=1, help="rows per batch (default 1)")
    parser.add_argument("--epochs", type=at_least(1), default=1, help="epochs to check (default 1)")
    parser.add_argument("--shuffle-buffer", type=at_least(1), default=None,
                        help="shuffle buffer rows (default: the loader's, 131,072)")
    parser.add_argument("--seed", type=int, default=0, help="the loader's seed= (default 0)")
    parser.add_argument("--drop-last", action="store_true", help="only full batches")
    parser.add_argument("--no-shuffle", action="store_true", help="file order (shuffle=False)")
    resume = parser.add_argument_group("resume", "stop at --resume-at and go on with the --new-* settings")
    resume.add_argument("--resume-at", type=float, default=None, metavar="F",
                        help="where to stop and resume, in epochs: 0.5 is the middle of epoch 0, 1.25 a quarter "
                        "into epoch 1")
    resume.add_argument("--new-world-size", type=at_least(1), default=None, help="ranks after the resume")
    resume.add_argument("--new-num-workers", type=at_least(0), default=None, help="workers after the resume")
    resume.add_argument("--new-batch-size", type=at_least(1), default=None, help="batch size after the resume")
    resume.add_argument("--new-shuffle-buffer", type=at_least(1), default=None, help="buffer rows after the resume")
    parser.add_argument("--stream-rows", type=at_least(0), default=None,
                        help="rows per checked rank of the real stream over row numbers, compared with the dry "
                        "run (default 200,000; 0: skip)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-': to stdout, instead of "
                        "the text)")


def run(args: argparse.Namespace) -> int:
    """Run ``naiad check``; 0 when every check passed, 1 with the reasons when one failed."""
    from naiad.tools.coverage import DEFAULT_STREAM_ROWS, check_coverage

    new = (args.new_world_size, args.new_num_workers, args.new_batch_size, args.new_shuffle_buffer)
    if args.resume_at is None and any(v is not None for v in new):
        from naiad.errors import ConfigError

        raise ConfigError("the --new-* settings apply after a resume: give --resume-at too.")
    report = check_coverage(
        args.source, world_size=args.world_size, num_workers=args.num_workers, batch_size=args.batch_size,
        epochs=args.epochs, shuffle=not args.no_shuffle, shuffle_buffer=args.shuffle_buffer, seed=args.seed,
        drop_last=args.drop_last, resume_at=args.resume_at, new_world_size=args.new_world_size,
        new_num_workers=args.new_num_workers, new_batch_size=args.new_batch_size,
        new_shuffle_buffer=args.new_shuffle_buffer,
        stream_rows=DEFAULT_STREAM_ROWS if args.stream_rows is None else args.stream_rows,
    )
    if args.json:
        text = json.dumps(report.as_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.json != "-":
        print(report.summary())
    if not report.ok:
        for problem in report.problems:
            print(f"naiad check: FAILED: {problem}", file=sys.stderr)
        return 1
    return 0
