"""Command line: ``lstmgrad demo`` and ``lstmgrad bench``. Parses and prints; the checks live in
:mod:`lstmgrad.demo`, the benchmark in :mod:`lstmgrad.bench`."""

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
    _add_bench(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from .demo import run_demo

        ok = run_demo(seed=args.seed, use_torch=not args.no_torch, out=sys.stdout)
        return 0 if ok else 1
    if args.command == "bench":
        return _bench(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .bench import DEFAULT_SHAPES, SHAPES

    known = ", ".join(f"{k} (T,B,I,H,L,D = {','.join(map(str, v))})" for k, v in SHAPES.items())
    p = sub.add_parser(
        "bench",
        help="time lstmgrad against torch.nn.LSTM on this machine (backward alone and forward + "
        "backward, both in this process, interleaved); needs PyTorch",
        description="Quick side-by-side benchmark of lstmgrad and torch.nn.LSTM on this "
        f"machine. Shapes: {known}.",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated shape names (default {','.join(DEFAULT_SHAPES)})",
    )
    group.add_argument("--shape", metavar="T,B,I,H,L,D", help="one shape given by its sizes")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument(
        "--input",
        choices=("tensors", "numpy"),
        default="tensors",
        help="what lstmgrad is given: torch tensors (its GEMMs on torch's, default) or NumPy "
        "arrays (its GEMMs on NumPy's BLAS); the torch side always gets tensors",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.rounds < 1:
        print("lstmgrad bench: --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        if args.shape:
            shapes = {
                "T{}-B{}-I{}-H{}-L{}-D{}".format(*d): d for d in [bench.parse_shape(args.shape)]
            }
        else:
            shapes = {n.strip(): bench.SHAPES[n.strip()] for n in args.shapes.split(",")}
    except (KeyError, ValueError) as exc:
        print(
            f"lstmgrad bench: bad shape: {exc}; known: {', '.join(bench.SHAPES)}", file=sys.stderr
        )
        return 2
    try:
        doc = bench.run(shapes, args.dtype, args.rounds, args.input, lambda s: print(s, flush=True))
    except bench.TorchMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    print(bench.report(doc))
    if args.json:
        bench.save_json(doc, args.json)
        print(f"json {args.json}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
