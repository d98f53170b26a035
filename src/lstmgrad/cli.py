"""Command line: ``lstmgrad demo | tune``. Parses and prints; the work lives in :mod:`lstmgrad.demo`
and :mod:`lstmgrad.tune`."""

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
    tune = sub.add_parser(
        "tune",
        help="measure this machine's execution plans for given shapes, or show / forget "
        "the stored measurements",
    )
    tune.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="T,B,I,H[,L[,D]]",
        help="a shape to measure (repeatable)",
    )
    tune.add_argument(
        "--input",
        choices=("numpy", "tensors"),
        default="tensors",
        help="the callers' data: NumPy arrays (NumPy's BLAS) or torch tensors (default)",
    )
    tune.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32")
    tune.add_argument("--show", action="store_true", help="print what is stored (JSON)")
    tune.add_argument("--reset", action="store_true", help="forget the stored measurements")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from .demo import run_demo

        ok = run_demo(seed=args.seed, use_torch=not args.no_torch, out=sys.stdout)
        return 0 if ok else 1
    if args.command == "tune":
        return _tune(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _tune(args: argparse.Namespace) -> int:
    import json

    from . import plan, tune

    kind = "torch" if args.input == "tensors" else "numpy"
    if kind == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("lstmgrad tune --input tensors needs PyTorch (pip install torch); "
                  "use --input numpy", file=sys.stderr)  # fmt: skip
            return 2
    try:
        shapes = [tune.parse_shape(s) for s in args.shape]
    except ValueError as exc:
        print(f"lstmgrad tune: --shape: {exc}", file=sys.stderr)
        return 2
    if args.reset:
        for k in ("numpy", "torch") if kind == "torch" else ("numpy",):
            store = plan.wisdom(k)
            store.clear()
            print(f"forgot {store.path}")
        plan.forget()
    for row in tune.tune_shapes(shapes, kind, args.dtype):
        s = row["shape"]
        print(f"T{s['T']} B{s['B']} I{s['I']} H{s['H']} L{s['L']} D{s['D']} ({args.input}, "
              f"{args.dtype}): {row['plan'].describe()} [{row['seconds']:.2f} s]")  # fmt: skip
    if args.show or not (shapes or args.reset):
        print(json.dumps(plan.show(), indent=1, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
