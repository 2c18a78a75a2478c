"""The `specsample` command: demo, generate, bench, check, distill."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specsample.cli import _bench, _check, _demo, _distill, _generate

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="specsample", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _demo.add_parser(sub)
    _generate.add_parser(sub)
    _bench.add_parser(sub)
    _check.add_parser(sub)
    _distill.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as err:
        print(f"specsample {args.command}: error: {err}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
