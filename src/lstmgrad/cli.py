"""Command line: ``lstmgrad demo``. Parses and prints; the checks live in :mod:`lstmgrad.demo`."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lstmgrad`` console script and of ``python -m lstmgrad``."""
    parser = argparse.ArgumentParser(
        prog="lstmgrad",
        description="The LSTM backward operator of CANN (aclnnLstmBackward) and its forward "
        "(aclnnLSTM) on a CPU.",
    )
    parser.add_argument("--version", action="version", version=f"lstmgrad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the documented sample and a random 2-layer bidirectional variable-length "
        "case against the float64 reference (and PyTorch autograd when installed)",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the random case (default 0)")
    demo.add_argument("--no-torch", action="store_true", help="skip the PyTorch autograd check")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from .demo import run_demo

        ok = run_demo(seed=args.seed, use_torch=not args.no_torch, out=sys.stdout)
        return 0 if ok else 1
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
