"""The ``naiad`` command: one module per subcommand under ``naiad.cli``.

Each subcommand module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

# Subcommands in the order `naiad --help` lists them.
_COMMANDS = ("demo", "bench", "tune", "check", "convert", "inspect")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``naiad`` command with every available subcommand."""
    from naiad._version import __version__

    parser = argparse.ArgumentParser(
        prog="naiad",
        description="Feed PyTorch training from data of any size, as fast as the hardware allows.",
    )
    parser.add_argument("--version", action="version", version=f"naiad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        if importlib.util.find_spec(f"naiad.cli.{name}") is None:
            continue
        module = importlib.import_module(f"naiad.cli.{name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run_command=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``naiad`` console command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run_command", None) is None:
        parser.print_help()
        return 2
    from naiad.errors import NaiadError

    try:
        return int(args.run_command(args) or 0)
    except NaiadError as exc:  # a clear message is the whole story; no traceback
        print(f"naiad {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
