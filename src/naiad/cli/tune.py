"""``naiad tune``: sweep worker counts, modes, prefetch depths, block sizes and shuffle buffers
on your data; recommend one and say which default it would change.

Instead of changing ``num_workers`` or ``block_bytes`` by hand and timing each run, ``naiad tune
SOURCE`` runs the same loop for every setting, each on a freshly built reader: a few seconds each, with ``--step-ms`` of training step (a sleep,
standing for the accelerator: the CPU is free meanwhile). Per setting it reports the rows per
second, the time the loop waited for each batch, the CPU the loader used (training process plus
workers, 100% = one core), the peak memory (proportional set size, so pages shared by forked
workers count once) and the time to the first batch. It recommends the cheapest setting (fewest
workers, threads before processes, shallow prefetch, default block and buffer) within 5% of the
best throughput among the settings that shuffle as well as the aim (``|corr| <= 0.02``, a batch
span of at least 98% of a full permutation's, or the defaults' own figures where they miss it;
the figures come from a dry run of two epochs over row numbers, NOTE [ Coverage check ]), and
measures the defaults (``naiad.DataLoader(naiad.read(path), batch_size=B, shuffle=True, seed=0)``)
against it.

    naiad tune demo --step-ms 2
    naiad tune "data/*.parquet" --batch-size 512 --json tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from naiad.cli.tune_measure import Target, load_source, measure, shuffle_figures
from naiad.cli.tune_report import (
    DEFAULTS,
    TOLERANCE,
    Setting,
    defaults_report,
    format_table,
    quality_bar,
    recommend,
)
from naiad.parallel.threads import usable_cores

NAME = "tune"
HELP = ("Sweep num_workers, worker_mode, prefetch_factor, block size and shuffle buffer on a source; "
        "recommend a setting.")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("process", "thread")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are 'process' and 'thread', got {text!r}")
    return modes


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def _size(text: str) -> int:
    # Binary units, as block sizes are usually given: 1M = 1 MiB.
    t = text.strip().upper()
    number = t.rstrip("KMGIB ")
    unit = t[len(number):].strip()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not value > 0 or value * _UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or sizes such as 65536, 512K, 1M, 4MiB (comma-separated), got {text.strip()!r}"
        )
    return int(value * _UNITS[unit])


def _sizes(text: str) -> list[int | None]:
    """``"auto,1M,4M"`` -> ``[None, 1048576, 4194304]`` (None: the reader's default)."""
    values = [None if v.strip().lower() == "auto" else _size(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected 'auto' or sizes such as 1M, got {text!r}")
    return list(dict.fromkeys(values))


def _buffers(text: str) -> list[int | None]:
    """``"auto,524288"`` -> ``[None, 524288]`` (None: the loader's default), in rows."""
    try:
        values = [None if v.strip().lower() == "auto" else int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v is not None and v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected 'auto' or row counts >= 1 (comma-separated), got {text!r}")
    return list(dict.fromkeys(values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad tune`` options to ``parser``."""
    parser.add_argument("source", help="'demo' (built-in diabetes-shaped CSV), a file, or a glob")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the demo data (default 200,000)")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    parser.add_argument(
        "--step-ms", type=float, default=0.0,
        help="synthetic training step per batch, in ms: a sleep, the CPU stays free (default 0)",
    )
    parser.add_argument(
        "--load", choices=("stream", "memory"), default="stream",
        help="stream the file with naiad's reader (default), or load it into a TensorDataset "
        "first, as the PyTorch tutorial does (CSV and Parquet)",
    )
    parser.add_argument(
        "--workers", type=_ints, default=None,
        help=f"worker counts to try (default 0..{usable_cores()}, the usable cores)",
    )
    parser.add_argument("--modes", type=_modes, default=["process", "thread"], help="default process,thread")
    parser.add_argument("--prefetch", type=_ints, default=[2, 4], help="prefetch_factor values (default 2,4)")
    parser.add_argument(
        "--block-bytes", type=_sizes, default=None,
        help="block sizes to try for CSV, JSONL and text sources ('auto': the reader's default; "
        "1M = 1 MiB; default auto,1M,4M). Parquet, Arrow and npy blocks are the file's row groups, "
        "batches or rows",
    )
    parser.add_argument(
        "--buffer", type=_buffers, default=None,
        help="shuffle buffers to try, in rows, for streaming sources ('auto': the default; default auto)",
    )
    parser.add_argument(
        "--full", action="store_true",
        help="every worker setting at every block size and buffer (default: at the default ones "
        "only, the others with 0 workers and the most workers on threads)",
    )
    parser.add_argument(
        "--any-order", action="store_true",
        help="rank settings by speed alone: also recommend one that mixes less than the aim "
        "(|corr| <= 0.02, batch span >= 98%% of a full permutation's) or the defaults",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per setting (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def settings_for(
    workers: list[int], modes: list[str], prefetch: list[int],
    blocks: list[int | None] | None = None, buffers: list[int | None] | None = None, *, full: bool = False,
) -> list[Setting]:
    """The sweep: every worker setting at the default block size and buffer (else the first
    given), and each other block size and buffer with 0 workers and the most workers on threads.

    0 workers appear once per block and buffer (they have no mode and no prefetch). ``full``
    crosses every block size and buffer with every worker setting.
    """
    every: list[tuple[int, str, int | None]] = []
    for w in sorted(set(workers)):
        if w == 0:
            every.append((0, "inline", None))
            continue
        for m in modes:
            for p in sorted(set(prefetch)):
                every.append((w, m, max(1, p)))
    few = [s for s in every if s[0] == 0]
    if max(workers) > 0:
        few.append((max(workers), "thread" if "thread" in modes else modes[0], max(1, min(prefetch))))
    block_list: list[int | None] = blocks or [None]
    buffer_list: list[int | None] = buffers or [None]
    first = (None if None in block_list else block_list[0], None if None in buffer_list else buffer_list[0])
    out = []
    for b in block_list:
        for buf in buffer_list:
            for w, m, pf in every if full or (b, buf) == first else few:
                out.append(Setting(w, m, pf, b, buf))
    return out


class _Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per step otherwise)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.tty = sys.stderr.isatty()

    def show(self, done: int, words: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * done // max(1, self.total)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {words}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            if done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _sweep_options(args: argparse.Namespace, target: Target) -> tuple[list[int | None], list[int | None]]:
    """The block sizes and buffers to sweep; a ConfigError when they do not apply to ``target``."""
    from naiad.errors import ConfigError

    blocks = args.block_bytes or ([None, 1 << 20, 4 << 20] if target.line_blocks else [None])
    buffers = args.buffer or [None]
    if target.memory is not None and (blocks != [None] or buffers != [None]):
        raise ConfigError("`--block-bytes` and `--buffer` apply to streamed sources; drop them or use --load stream.")
    if not target.line_blocks and blocks != [None]:
        raise ConfigError(
            f"`--block-bytes` applies to CSV, JSONL and text sources, got {target.paths[0]!r}, whose blocks are "
            "its row groups, record batches or rows; drop the option."
        )
    return blocks, buffers


def run(args: argparse.Namespace) -> int:
    """Run ``naiad tune``; the exit status."""
    from naiad.errors import ConfigError, NaiadError

    if args.batch_size < 1:
        print(f"naiad tune: `--batch-size` must be >= 1, got {args.batch_size}.", file=sys.stderr)
        return 2
    if args.seconds <= 0:
        print(f"naiad tune: `--seconds` must be > 0, got {args.seconds}.", file=sys.stderr)
        return 2
    try:
        target = load_source(args.source, rows=args.rows, load=args.load)
        blocks, buffers = _sweep_options(args, target)
    except (ConfigError, NaiadError, OSError) as exc:
        print(f"naiad tune: {exc}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else list(range(usable_cores() + 1))
    sweep = settings_for(workers, args.modes, args.prefetch, blocks, buffers, full=args.full)
    print(f"naiad tune: {target.words}; batch size {args.batch_size}; step {args.step_ms:g} ms; "
          f"{len(sweep)} settings, {args.seconds:g} s each; {usable_cores()} usable cores")
    # One step per setting, one for the defaults when they are not one, one for the shuffle figures.
    progress = _Progress(len(sweep) + (DEFAULTS not in sweep) + 1, not args.no_progress)
    results = []
    for i, setting in enumerate(sweep):
        progress.show(i, setting.words())
        results.append(measure(target, setting, batch_size=args.batch_size, step_s=args.step_ms / 1e3, seconds=args.seconds))
    # The defaults are a setting of the sweep when it has 0 workers; else they run once more.
    defaults = next((r for r in results if r.setting == DEFAULTS), None)
    if defaults is None:
        progress.show(len(sweep), "the defaults")
        defaults = measure(target, DEFAULTS, batch_size=args.batch_size, step_s=args.step_ms / 1e3, seconds=args.seconds)
    progress.show(progress.total - 1, "shuffle quality")
    figures: dict[tuple[int | None, int | None], tuple[float, float]] = {}
    streamed = target.memory is None  # a sampler's permutation: no figures, no bar
    for r in [*results, defaults] if streamed else []:
        key = (r.setting.block_bytes, r.setting.shuffle_buffer)
        if key not in figures:
            figures[key] = shuffle_figures(target.dataset(key[0]), key[1], args.batch_size)
        r.corr, r.span = figures[key]
    progress.show(progress.total, "done")
    bar = quality_bar(defaults.corr, defaults.span, args.batch_size) if streamed and not args.any_order else None
    chosen = recommend(results, bar)
    print(format_table(results, chosen, blocks=target.line_blocks, buffers=streamed, bar=bar))
    print(f"\nRecommended: {chosen.setting.words()}")
    among = "" if bar is None else f" among those with {bar.words()} (the others marked -)"
    print(f"  the cheapest setting within {TOLERANCE:.0%} of the best rows/s{among}; "
          f"the loop waits {chosen.wait_ms_per_step:.3f} ms per step there.")
    default_block = target.default_block_bytes()
    default_buffer = None if target.memory is not None else _default_buffer()
    call = f"naiad.DataLoader({'dataset' if target.memory is not None else 'naiad.read(path)'}, batch_size={args.batch_size}, shuffle=True, seed=0)"
    lines, todo = defaults_report(results, defaults, chosen, call, default_block, default_buffer, bar)
    print("\n".join(lines))
    if args.json:
        payload = {
            "source": target.words,
            "batch_size": args.batch_size,
            "step_ms": args.step_ms,
            "default_block_bytes": default_block,
            "default_shuffle_buffer": default_buffer,
            "results": [r.as_json() for r in results],
            "quality_bar": None if bar is None else asdict(bar),
            "recommended": asdict(chosen.setting),
            "defaults": defaults.as_json(),
            "recommended_over_defaults": chosen.rows_per_s / defaults.rows_per_s if defaults.rows_per_s else None,
            "changes": todo,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return 0


def _default_buffer() -> int | None:
    # The loader's default shuffle buffer, for the words only (None where naiad names none).
    from naiad.stream import batches as stream

    value = getattr(stream, "DEFAULT_SHUFFLE_BUFFER_ROWS", None)
    return value if isinstance(value, int) else None
