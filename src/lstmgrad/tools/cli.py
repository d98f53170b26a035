"""Command line: ``lstmgrad demo | bench | tune | check``. Parses and prints; the work lives in
:mod:`lstmgrad.tools.demo`, :mod:`lstmgrad.tools.bench`, :mod:`lstmgrad.planning.tune` and :mod:`lstmgrad.tools.check`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.errors import torch_missing


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lstmgrad`` console script and of ``python -m lstmgrad``.

    A reader that closes the pipe early (``lstmgrad tune --show | head``) ends the command
    quietly with status 1, as the Python documentation's recipe for SIGPIPE does.
    """
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe raises here, not at the interpreter's exit
    except BrokenPipeError:
        # stdout now points at devnull, so the interpreter's own flush at exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
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
        help="measure this machine's execution plans for given shapes (a few seconds a "
        "shape), or show / forget the stored measurements",
        epilog=_shapes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_argument(
        "--shape",
        action="append",
        default=[],
        type=_shape_arg,
        metavar="T,B,I,H[,L[,D]]",
        help="a shape to measure (repeatable): its sizes, L and D 1 unless given, or a name below",
    )
    tune.add_argument(
        "--input",
        choices=("numpy", "tensors"),
        default="tensors",
        help="the callers' data for --shape: NumPy arrays (NumPy's BLAS) or torch tensors "
        "(default; needs PyTorch)",
    )
    tune.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32")
    tune.add_argument(
        "--show",
        action="store_true",
        help="print what is stored for this machine's configuration: a line per measured "
        "class of shapes (the default without --shape or --reset)",
    )
    tune.add_argument(
        "--json",
        action="store_true",
        help="print what is stored as JSON (the whole record) instead of the table; implies --show",
    )
    tune.add_argument(
        "--reset",
        action="store_true",
        help="delete every stored measurement (all thread counts and library versions)",
    )
    _add_bench(sub)
    _add_check(sub)
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
    if args.command == "bench":
        return _bench(args)
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _tune(args: argparse.Namespace) -> int:
    from ..planning import plan

    kind = "torch" if args.input == "tensors" else "numpy"
    shapes = [s.sizes() for s in args.shape]
    if (shapes or args.show or args.json or not args.reset) and _bad_environment("tune"):
        return 2
    if kind == "torch":
        try:
            import torch  # noqa: F401  (--show: the torch store's key names torch's version)
        except ImportError:
            if shapes:  # only measuring runs tensors; --show and --reset touch none
                print(f"{torch_missing('lstmgrad tune --input tensors')}; or use --input numpy",
                      file=sys.stderr)  # fmt: skip
                return 2
    if args.reset:
        removed = plan.reset()
        for path in removed:
            print(f"forgot {path}")
        if not removed:
            print(f"nothing stored at {plan.cache_dir()}")
    unstored = 0
    from ..ops.api import tune_shapes
    from ..planning import tune

    for row in tune_shapes(shapes, kind, args.dtype) if shapes else ():
        s = row["shape"]
        where = f"not stored: {row['not_stored']}" if row["not_stored"] else "stored"
        unstored += bool(row["not_stored"])
        if row["gate"] is not None:  # the measured plan against the default, in the gate
            kept = "measured plan" if row["gate"] >= plan.GATE_MARGIN else "default plan"
            where += f"; measured plan {row['gate']:.2f}x as fast as the default: {kept} used"
        print(f"T{s['T']} B{s['B']} I{s['I']} H{s['H']} L{s['L']} D{s['D']} ({args.input}, "
              f"{args.dtype}): {row['plan'].describe()} [{row['seconds']:.2f} s; {where}]")  # fmt: skip
    if args.show or args.json or not (shapes or args.reset):
        stored = plan.show()
        if args.json:
            print(json.dumps(stored, indent=1, default=str))
        else:
            print("\n".join(tune.show_lines(stored, plan.GATE_MARGIN)))
    if unstored:
        print(f"lstmgrad tune: {unstored} of {len(shapes)} shapes stored nothing (see above): "
              "later processes will measure them again", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _bad_environment(command: str) -> bool:
    """Whether an LSTMGRAD_* variable holds a value outside its choices (then said on stderr):
    checked before a command's work, which would stop at its first call."""
    from ..core import env
    from ..planning import plan

    try:
        env.check()
        plan.overrides()  # LSTMGRAD_PLAN
    except ValueError as exc:
        print(f"lstmgrad {command}: {exc}", file=sys.stderr)
        return True
    return False


def _shapes_epilog() -> str:
    """The named shapes a --shape takes, for a command's --help."""
    from . import shapes

    varlen = " and ".join(s.id for s in shapes.SHAPES if s.varlen)
    return "\n".join(["named shapes (T,B,I,H,L,D):", *shapes.help_lines(),
                      f"(the variable-length shapes {varlen} are timed by the repository's",
                      "benchmarks/run.py)"])  # fmt: skip


def _shape_arg(text: str) -> Any:
    """A shape as T,B,I,H[,L[,D]] or a dense shape's name (argparse type of --shape)."""
    from . import shapes

    try:
        return shapes.parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape_names(text: str) -> Any:
    """Comma-separated names of dense shapes (argparse type of bench's --shapes)."""
    from . import shapes

    try:
        return shapes.parse_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .bench import DEFAULT_SHAPES

    p = sub.add_parser(
        "bench",
        help="time lstmgrad against torch.nn.LSTM on this machine (backward alone and forward + "
        "backward, both in this process, interleaved; --workload: inside models); needs "
        "PyTorch; about half a minute on 2 cores",
        description=textwrap.fill(
            "Quick side-by-side benchmark of lstmgrad and torch.nn.LSTM on this machine, on "
            "named shapes (below) or one given by its sizes. At the defaults it takes about half "
            "a minute on 2 cores (--quick: about 10 s); the first run on a machine adds up to "
            "half a minute of compiling kernels and measuring the shapes' plans. A line per "
            "shape shows progress. --workload times lstmgrad.nn.LSTM against torch.nn.LSTM "
            "inside models instead: grid, a training step and an eval forward of Embedding -> "
            "LSTM -> Linear over a fixed sample of 40 realistic shapes (about 5-10 minutes on 2 "
            "cores with an empty plan cache); word-lm, the word-level language model of "
            "PyTorch's examples/word_language_model on a generated corpus, both sides trained "
            "alternately (about 1.5 minutes); tagger, a packed sequence tagger (character and "
            "word BiLSTMs over PackedSequences), each side in fresh processes, a first run on "
            "empty plan and Numba caches, then a second run on them (about 1 minute). With "
            "--quick each workload takes well under a minute.",
            78,
        ),
        epilog=_shapes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--shapes",
        type=_shape_names,
        metavar="NAME[,NAME...]",
        help=f"comma-separated shape names (default {','.join(DEFAULT_SHAPES)})",
    )
    group.add_argument(
        "--shape",
        type=_shape_arg,
        metavar="T,B,I,H[,L[,D]]",
        help="one shape: its sizes, L and D 1 unless given, or a name",
    )
    p.add_argument("--dtype", choices=("float32", "float16"), default=None)
    p.add_argument(
        "--rounds",
        type=int,
        help="timed rounds (default 5); with --workload: grid's rounds per shape (default 5), "
        "word-lm's chunks of batches per side (default 10), tagger's runs of fresh processes "
        "(default 2: the first run and a second)",
    )
    p.add_argument(
        "--input",
        choices=("tensors", "numpy"),
        default=None,
        help="what lstmgrad is given: torch tensors (its GEMMs on torch's, default) or NumPy "
        "arrays (its GEMMs on NumPy's BLAS); the torch side always gets tensors",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--png", metavar="PATH", help="also draw the speedups (needs matplotlib)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ROUNDS} rounds of {','.join(QUICK_SHAPES)} unless shapes or rounds are "
        "given (about 10 s on 2 cores); with --workload its quick configuration: grid 3 small "
        "shapes and 2 rounds, word-lm 2 rounds of 3 batches, tagger 96 sentences and 1 epoch",
    )
    p.add_argument(
        "--workload",
        metavar="|".join(WORKLOADS),
        help="a model's training and evaluation instead of the shapes (see above)",
    )
    p.add_argument(
        "--busy",
        metavar="N",
        help="with --workload: N busy processes (0, 1 or 2) beside both sides, as other work on "
        "the machine would be (default 0)",
    )


QUICK_SHAPES = ("small-2", "med-3")
QUICK_ROUNDS = 3
WORKLOADS = ("grid", "word-lm", "tagger")


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.workload is not None and args.workload not in WORKLOADS:
        print(f"lstmgrad bench: --workload must be {', '.join(WORKLOADS[:-1])} or "
              f"{WORKLOADS[-1]}, got {args.workload!r}", file=sys.stderr)  # fmt: skip
        return 2
    busy = {"0": 0, "1": 1, "2": 2}.get((args.busy or "0").strip())
    if busy is None:
        print(f"lstmgrad bench: --busy must be 0, 1 or 2 (busy processes beside both sides), "
              f"got {args.busy!r}", file=sys.stderr)  # fmt: skip
        return 2
    if args.rounds is not None and args.rounds < 1:
        print("lstmgrad bench: --rounds must be at least 1", file=sys.stderr)
        return 2
    if _bad_environment("bench"):
        return 2
    if args.workload is not None:
        return _bench_workload(args, busy)
    if busy:
        print("lstmgrad bench: --busy applies to --workload (the shape benchmark shows the "
              "cores other processes used instead)", file=sys.stderr)  # fmt: skip
        return 2
    args.dtype = args.dtype or "float32"
    args.input = args.input or "tensors"
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else 5
    from .shapes import BY_ID

    if args.shape:  # sizes are "custom" in the record and its tables
        named = [args.shape]
        names = [args.shape.id if args.shape.id in BY_ID else "custom"]
    else:
        named = args.shapes or [BY_ID[n] for n in (QUICK_SHAPES if args.quick
                                                   else bench.DEFAULT_SHAPES)]  # fmt: skip
        names = [s.id for s in named]
    shapes = {n: (s.T, s.B, s.I, s.H, s.L, s.D) for n, s in zip(names, named, strict=True)}

    def progress(doc: dict[str, Any]) -> None:
        if not doc["results"]:
            print("\n".join(_bench_header(doc)), flush=True)
            print(f"timing {len(shapes)} shape(s), {args.rounds} rounds each; a shape new to "
                  "this machine first compiles and measures for up to half a minute", flush=True)  # fmt: skip
            return
        r = doc["results"][-1]
        print(f"  [{len(doc['results'])}/{len(shapes)}] {r['shape']}: backward {r['bwd']['ratio']:.2f}x, forward + backward "
              f"{r['fwdbwd']['ratio']:.2f}x (other processes used {r['other_cores']} cores)",
              flush=True)  # fmt: skip

    try:
        doc = bench.run(shapes, args.dtype, args.rounds, args.input, progress)
    except bench.TorchMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    print(_bench_tables(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"json {args.json}")
    if args.png:
        try:
            bench.plot(doc, args.png)
        except ImportError:
            print("lstmgrad bench: --png needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
        print(f"png {args.png}")
    return 0


def _bench_workload(args: argparse.Namespace, busy: int) -> int:
    """``lstmgrad bench --workload``: a workload of :mod:`lstmgrad.tools.workloads`, its
    progress, its table and (``--json``) its record."""
    from . import workloads as w

    other = [o for o, v in (("--shapes", args.shapes), ("--shape", args.shape),
                            ("--dtype", args.dtype), ("--input", args.input),
                            ("--png", args.png)) if v]  # fmt: skip
    if other:
        print(f"lstmgrad bench: {', '.join(other)} apply to the shape benchmark, not to "
              f"--workload {args.workload}", file=sys.stderr)  # fmt: skip
        return 2
    try:
        import torch  # noqa: F401  (both sides of every workload)
    except ImportError:
        print(torch_missing("lstmgrad bench"), file=sys.stderr)
        return 2
    quick, path = args.quick, args.json
    sizes = w.RUN_SIZES[args.workload][quick]

    def say(line: str) -> None:
        print(f"  {line}", flush=True)

    if args.workload == "grid":
        shapes = w.quick_shapes() if quick else w.grid_sample()
        rounds = args.rounds or sizes["rounds"]
        print(f"grid: a training step and an eval forward of Embedding -> LSTM -> Linear, "
              f"{len(shapes)} shapes, {rounds} rounds each, {busy} busy processes; a class of "
              "shapes new to this machine is measured first (seconds)", flush=True)  # fmt: skip

        def progress(doc: dict[str, Any]) -> None:
            say(f"[{len(doc['results'])}/{len(shapes)}] "
                + "  ".join(w.format_grid_row(doc["results"][-1])).rstrip())  # fmt: skip
            if path:
                w.write_json(doc, path)  # an interrupted run keeps what it measured

        doc = w.run_grid(shapes, rounds, busy_n=busy, progress=progress)
        table = w.format_grid(doc)
    elif args.workload == "word-lm":
        rounds, chunk, warmup = args.rounds or sizes["rounds"], sizes["chunk"], sizes["warmup"]
        print(f"word-lm: PyTorch's word-level language model (2-layer LSTM 200/200, bptt 35, "
              f"batch 20), {warmup} untimed batches then {rounds} rounds of {chunk} batches per "
              f"side, {busy} busy processes", flush=True)  # fmt: skip
        doc = w.run_word_lm(rounds, chunk, warmup, busy, progress=say)
        table = w.format_word_lm(doc)
    else:
        epochs, sentences = sizes["epochs"], sizes["sentences"]
        runs = args.rounds or 2
        print(f"tagger: {runs} runs of a fresh process per side (run 1 on empty plan and Numba "
              f"caches), {epochs} epochs of {sentences} sentences each, {busy} busy processes",
              flush=True)  # fmt: skip
        doc = w.run_tagger(epochs, runs, busy, sentences, progress=say)
        table = w.format_tagger(doc)
    print(w.format_meta(doc["meta"]))
    print(table)
    if path:
        print(f"json {w.write_json(doc, path)}")
    print(f"total {doc['meta']['total_s']:.0f} s")
    return 1 if doc.get("summary", {}).get("errors") else 0


_MM = {"torch": "torch.mm", "numpy": "numpy.matmul"}  # what measured each library's peak


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _bench_header(doc: dict[str, Any]) -> list[str]:
    """The machine lines of a ``lstmgrad bench`` record."""
    m, c = doc["machine"], doc["config"]
    pools = m["threadpools"]
    if isinstance(pools, list):
        keys = ("internal_api", "version", "architecture", "num_threads")
        pools = ", ".join(" ".join(str(p[k]) for k in keys if p[k]) + " threads" for p in pools)
    quota = m["cgroup_cpu_quota"]
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v is not None) or "none set"
    peak = ", ".join(
        f"{_MM[k.split('_')[0]]} {k.split('_')[1]} {v:.3g}" for k, v in m["peak_gflops"].items()
    )
    return [
        f"cpu      {m['cpu']}; {m['affinity']} logical CPUs usable (os.cpu_count {m['cpu_count']})"
        f", cgroup quota {f'{quota:g} CPUs' if quota else 'none'}",
        f"threads  torch {m['torch']} {m['torch_threads']}, Numba {m['numba']} "
        f"{m['numba_threads']}; BLAS/OpenMP: {pools}; env: {env}",
        f"peak     GEMM GFLOP/s, {m['peak_note']}: {peak}",
        f"run      {c['dtype']}, lstmgrad given {c['input']}, {c['rounds']} rounds",
    ]


def _bench_tables(doc: dict[str, Any]) -> str:
    """The tables: per item, both sides' ms, the speedup and GFLOP/s (% of peak)."""
    from . import bench

    c, pk = doc["config"], doc["machine"]["peak_gflops"]
    lg_lib = bench.gemm_library(c["input"])
    t_peak, lg_peak = pk["torch_float32"], pk[f"{lg_lib}_float32"]
    out = [
        "",
        "GFLOP/s: GEMM FLOPs per second; (%): of the measured float32 GEMM peak of the side's "
        f"library, torch.mm {t_peak:.3g} for torch, {_MM[lg_lib]} {lg_peak:.3g} for lstmgrad",
    ]
    for item, title in (("bwd", "Backward alone"), ("fwdbwd", "Forward + backward")):
        head = ["shape", "T B I H L D", "torch path", "torch ms", "lstmgrad ms", "speedup"]
        head += ["torch GFLOP/s", "lstmgrad GFLOP/s", "other cores"]
        rows = [head]
        for res in doc["results"]:
            r = res[item]
            rows.append([
                res["shape"], " ".join(str(v) for v in res["dims"].values()), res["torch_path"],
                _ms(r["torch_ms"]), _ms(r["lstmgrad_ms"]),
                f"{r['ratio']:.2f}x [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]",
                *(f"{r[f'{s}_gflops']:.3g} ({100 * r[f'{s}_peak_frac']:.0f}%)"
                  for s in ("torch", "lstmgrad")),
                f"{res['other_cores']:.2f}",
            ])  # fmt: skip
        w = [max(len(row[k]) for row in rows) for k in range(len(head))]
        out += ["", f"{title} (speedup = median of per-round torch ms / lstmgrad ms; other "
                "cores = other processes' CPU use during the shape's rounds)"]  # fmt: skip
        out += ["  ".join(v.ljust(w[k]) for k, v in enumerate(row)).rstrip() for row in rows]
    return "\n".join(out[1:])


CHECK_EPILOG = """\
columns (each output against lstmgrad's float64 reference; msProbe's names):
  Cosine, MaxAbsErr, MaxRelErr     as msProbe compare: cosine similarity, max |N - B|, max |N - B| / |B|
  1/1000, 5/1000                   share of elements with relative error < 0.001 / < 0.005
  RMSE x, MaxRE x, MeanRE x, small x
                                   msProbe's benchmark standard: the device's RMSE, max and mean
                                   relative error and small-value error ratio divided by those of
                                   lstmgrad's fused engine in the dump's dtype, or by msProbe's
                                   floor for the dtype where larger (error above 2, 10, 2, 2;
                                   warning above 1)
  msProbe                          that standard's verdict with Cosine <= 0.99 and NaN/Inf as
                                   errors; in parentheses (float16, bfloat16) the ratios' status,
                                   information only
  bound off                        share of elements beyond c * eps * sqrt(K) * (|ref| + rms(ref)),
                                   K the length of the sum behind the output (c = --factor)
  verdict                          by --rule (default: the bound)
The full guide is docs/check.md in lstmgrad's source tree.
"""


def _positive(text: str) -> float:
    """A finite number above 0 (argparse type of --factor)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text!r}")
    return v


def _at_least_one(text: str) -> int:
    """An integer of at least 1 (argparse type of --top)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {v}")
    return v


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="the CPU golden of an LSTM on a device: judge every LSTM call of an msProbe dump "
        "(or a kernel-level or lstmgrad.dump dump) against lstmgrad's float64 reference "
        "(exit 0 pass, 1 fail, 2 not checked)",
        description=textwrap.fill(
            "Recompute every LSTM call of a dump with lstmgrad's float64 reference and its fused "
            "engine in the dump's dtype, and judge the device's outputs and gradients in "
            "msProbe's terms. PATH is an msProbe dump (dump.json, a rank or step folder, or the "
            "dump root: every rank and step found is checked), a folder of 'msprobe parse -t "
            "npy' files with --aclnn-backward/--aclnn-forward, or a .npz/.pt file written by "
            "lstmgrad.dump. Files are read inside PATH only (see --allow-dump-data-dir), and "
            "nothing in a dump is executed. Exit status: 0 every LSTM call found passes, 1 one "
            "fails, 2 one could not be checked (or none was), or the dump was refused or is "
            "not a dump.",
            78,
        ),
        epilog=CHECK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="PATH", help="the dump (see above)")
    kernel = p.add_mutually_exclusive_group()
    kernel.add_argument("--aclnn-backward", action="store_true",
                        help="PATH holds aclnnLstmBackward's arguments as .npy files")  # fmt: skip
    kernel.add_argument("--aclnn-forward", action="store_true",
                        help="PATH holds aclnnLSTM's arguments as .npy files")  # fmt: skip
    p.add_argument(
        "--rule",
        choices=("msprobe", "bound", "both", "rtol"),
        default=None,
        help="what decides the verdict: lstmgrad's accumulation-length bound (default), "
        "msProbe's benchmark standard with cosine (its ratios against lstmgrad's fused engine; "
        "shown in the table whatever the rule), both, or torch_npu's assertRtolEqual "
        "(lstmgrad.dump files only)",
    )
    p.add_argument("--factor", type=_positive, default=None,
                   help="c of the bound c * eps * sqrt(K) * (|ref| + rms(ref)) (default 4)")  # fmt: skip
    p.add_argument("--top", type=_at_least_one, default=3,
                   help="largest errors located per failing output (default 3)")  # fmt: skip
    p.add_argument("--csv", metavar="FILE", help="also write one row per (call, output)")
    p.add_argument("--json", metavar="FILE", help="also write the whole report as JSON")
    p.add_argument("--plot", metavar="DIR",
                   help="also draw one PNG per failing output into DIR (made if missing): its "
                   "largest error / bound along the time steps, the batch rows and the units or "
                   "gates, per layer and direction (needs matplotlib: the bench or dev extra)")  # fmt: skip
    p.add_argument("--plot-all", action="store_true",
                   help="with --plot: a PNG per judged output, not only the failing ones")  # fmt: skip
    p.add_argument("--allow-dump-data-dir", action="store_true",
                   help="read an msProbe dump's tensor files from a folder outside PATH: the "
                   "dump_data_dir that dump.json records (used when no dump_tensor_data is "
                   "beside it), or a dump_tensor_data that is a link out of PATH; without it "
                   "such a dump is refused (exit 2)")  # fmt: skip
    p.add_argument("--no-dropout", action="store_true",
                   help="the model ran without dropout between LSTM layers (dropout 0 or eval "
                   "mode): judge every layer of Module-level calls, which do not record it")  # fmt: skip
    cfg = p.add_argument_group("kernel-level dumps (the flags the files do not record; "
                               "inferred from the shapes when not given)")  # fmt: skip
    cfg.add_argument("--num-layers", type=_at_least_one, default=None)
    cfg.add_argument("--bidirectional", action="store_true", default=None)
    cfg.add_argument("--no-bias", action="store_true")
    cfg.add_argument("--batch-first", action="store_true")


def _e(v: float) -> str:
    return f"{v:.2e}"


@contextlib.contextmanager
def _tune_unless_set(value: str) -> Iterator[None]:
    """LSTMGRAD_TUNE set to ``value`` for the block unless the caller's environment sets it."""
    if "LSTMGRAD_TUNE" in os.environ:
        yield
        return
    os.environ["LSTMGRAD_TUNE"] = value
    try:
        yield
    finally:
        os.environ.pop("LSTMGRAD_TUNE", None)


def _judge_dump(args: argparse.Namespace, path: Path, rule: str, factor: float) -> list[Any]:
    """The reports of an msProbe dump or a folder of kernel-level files."""
    from . import msprobe

    if args.aclnn_backward or args.aclnn_forward:
        cfg = msprobe.KernelConfig(args.num_layers, args.bidirectional,
                                   False if args.no_bias else None, args.batch_first)  # fmt: skip
        kind = "backward" if args.aclnn_backward else "forward"
        return msprobe.check_kernel(path, kind, cfg, rule=rule, factor=factor, top=args.top)
    return msprobe.check_dump(path, rule=rule, factor=factor, top=args.top,
                              no_dropout=args.no_dropout,
                              allow_dump_data_dir=args.allow_dump_data_dir)  # fmt: skip


def _output_problem(option: str, value: str) -> str | None:
    """Why the file an output option names cannot be written, or None."""
    p = Path(value)
    if p.is_dir():
        return f"{option} {value}: is a folder; give a file name"
    if not p.parent.is_dir():
        return f"{option} {value}: no folder {p.parent} to write it in"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{option} {value}: the file is not writable"
    if not p.exists() and not os.access(p.parent, os.W_OK | os.X_OK):
        return f"{option} {value}: the folder {p.parent} is not writable"
    return None


def _folder_problem(option: str, value: str) -> str | None:
    """Why the folder an output option names cannot be written into, or None."""
    p = Path(value)
    if p.exists() and not p.is_dir():
        return f"{option} {value}: is a file; give a folder"
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            return f"{option} {value}: the folder is not writable"
        return None
    if not p.parent.is_dir():
        return f"{option} {value}: no folder {p.parent} to make it in"
    if not os.access(p.parent, os.W_OK | os.X_OK):
        return f"{option} {value}: the folder {p.parent} is not writable"
    return None


def _write_outputs(args: argparse.Namespace, reports: list[Any], rule: str,
                   factor: float) -> str | None:  # fmt: skip
    """Write --csv, --json and --plot; the first failure's message, or None."""
    from . import report

    try:
        if args.csv:
            with open(args.csv, "w", newline="", encoding="utf-8") as fh:
                report.write_csv(reports, fh)
            print(f"csv      {args.csv}")
        if args.json:
            Path(args.json).write_text(report.to_json(reports, rule, factor), encoding="utf-8")
            print(f"json     {args.json}")
    except OSError as exc:
        option = "--json" if args.json and getattr(exc, "filename", None) == args.json else "--csv"
        return f"{option}: could not write it ({exc.strerror or exc})"
    if args.plot:
        from . import plot

        try:
            files = plot.write_all(reports, args.plot, every=args.plot_all)
        except OSError as exc:
            return f"--plot: could not write into {args.plot} ({exc.strerror or exc})"
        which = "judged" if args.plot_all else "failing"
        print(f"plots    {len(files)} PNG files in {args.plot}, one per {which} output"
              if files else f"plots    none: no {which} output")  # fmt: skip
    return None


def _check(args: argparse.Namespace) -> int:
    if _bad_environment("check"):
        return 2
    path = Path(args.path)
    if not (args.aclnn_backward or args.aclnn_forward) and path.suffix in (".npz", ".pt"):
        return _check_lstmgrad_dump(args)
    if args.rule == "rtol":
        print("lstmgrad check: --rule rtol applies to lstmgrad.dump files only; msProbe and "
              "kernel dumps take msprobe, bound or both", file=sys.stderr)  # fmt: skip
        return 2
    if args.allow_dump_data_dir and (args.aclnn_backward or args.aclnn_forward):
        print("lstmgrad check: --allow-dump-data-dir applies to msProbe dumps (dump.json), not "
              "to kernel-level files", file=sys.stderr)  # fmt: skip
        return 2
    outputs = [(o, v) for o, v in (("--csv", args.csv), ("--json", args.json)) if v]
    problems = [m for o, v in outputs if (m := _output_problem(o, v))]
    if len(outputs) == 2 and Path(args.csv).resolve() == Path(args.json).resolve():
        problems.append(f"--csv and --json name the same file, {args.csv}")
    if args.plot_all and not args.plot:
        problems.append("--plot-all needs --plot DIR")
    if args.plot:
        from . import plot

        problems += [m for m in (_folder_problem("--plot", args.plot), plot.missing()) if m]
    if problems:  # before any work: a check can take minutes
        print(f"lstmgrad check: {problems[0]}", file=sys.stderr)
        return 2
    from . import msprobe, report

    rule = args.rule or "bound"
    factor = args.factor or msprobe.BOUND_FACTOR
    try:
        with _tune_unless_set("cached"):  # a check measures no plans: stored or default ones
            reports = _judge_dump(args, path, rule, factor)
    except msprobe.DumpReadError as exc:
        print(f"lstmgrad check: {exc}", file=sys.stderr)
        return 2
    except msprobe.DumpRefused as exc:
        print(f"lstmgrad check: refused: {exc}", file=sys.stderr)
        return 2
    print("against  lstmgrad's float64 reference; 'x' columns: the device's metric divided by "
          "lstmgrad's fused engine's (or the correctly rounded reference's, where larger; no "
          "less than msProbe's floor for the dtype): msProbe's benchmark standard")  # fmt: skip
    print()
    print("\n".join(report.table(reports, rule)))
    status = report.exit_status(reports)
    problem = _write_outputs(args, reports, rule, factor)
    if problem is not None:  # what was asked for is missing: not a pass, still a failure
        status = 1 if status == 1 else 2
    print(f"result   {report.summary(reports)}: exit {status}")
    if problem is not None:
        print(f"lstmgrad check: {problem}", file=sys.stderr)
    return status


def _check_lstmgrad_dump(args: argparse.Namespace) -> int:
    """A .npz / .pt file written by lstmgrad.dump: one aclnnLstmBackward call."""
    from . import check

    extra = [o for o, v in (("--csv", args.csv), ("--json", args.json), ("--plot", args.plot),
                            ("--plot-all", args.plot_all),
                            ("--no-dropout", args.no_dropout), ("--num-layers", args.num_layers),
                            ("--bidirectional", args.bidirectional), ("--no-bias", args.no_bias),
                            ("--batch-first", args.batch_first)) if v]  # fmt: skip
    if extra:
        print(f"lstmgrad check: {', '.join(extra)} apply to msProbe and kernel dumps, not to a "
              "lstmgrad.dump file", file=sys.stderr)  # fmt: skip
        return 2
    if args.allow_dump_data_dir:
        print("lstmgrad check: --allow-dump-data-dir applies to msProbe dumps (dump.json), not "
              "to a lstmgrad.dump file", file=sys.stderr)  # fmt: skip
        return 2
    if args.rule == "msprobe":  # pragma: no cover - kept for the message
        print("lstmgrad check: --rule msprobe applies to msProbe and kernel dumps; a "
              "lstmgrad.dump file takes bound, rtol or both", file=sys.stderr)  # fmt: skip
        return 2
    args.rule = args.rule or "bound"
    factor = check.BOUND_FACTOR if args.factor is None else args.factor
    try:
        rep = check.check(args.path, factor=factor, top=args.top)
    except check.DumpError as exc:
        print(f"lstmgrad check: bad dump: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"lstmgrad check: {exc}", file=sys.stderr)
        return 2
    dims = " ".join(f"{k} {v}" for k, v in rep.dims.items())
    prec = rep.outputs[0].rtol_prec
    print(f"dump     {args.path}: {rep.dtype}, {dims}")
    print("against  the float64 reference (on float64 copies of the dump); 'fused abs' is "
          f"lstmgrad's fused engine ({rep.dtype}) against the same reference")  # fmt: skip
    print(f"rules    bound: |device - ref| <= {factor:g} * eps({rep.dtype}) * sqrt(K) * (|ref| + "
          f"rms(ref)); rtol: torch_npu assertRtolEqual, prec {prec:g} (verdict: {args.rule})")  # fmt: skip
    head = ["output", "", "K", "max abs", "max rel", "fused abs", "rtol off", "bound off", ""]
    rows = [head]
    for r in rep.outputs:
        rows.append([
            r.key, r.name, str(r.accumulation), _e(r.max_abs), _e(r.max_rel), _e(r.fused_max_abs),
            f"{r.rtol_fraction:.2%}" + ("" if r.rtol_ok else " FAIL"),
            f"{r.bound_fraction:.2%}" + ("" if r.bound_ok else " FAIL"),
            "ok" if r.ok(args.rule) else "MISMATCH",
        ])  # fmt: skip
    w = [max(len(row[k]) for row in rows) for k in range(len(head))]
    for row in rows:
        print("  ".join(v.ljust(w[k]) for k, v in enumerate(row)).rstrip())
    bad = [r for r in rep.outputs if not r.ok(args.rule)]
    if bad:
        print("largest errors (absolute; times the bound):")
        for r in bad:
            for err, ratio, where in [w for w in r.worst if w[1] > 1] or r.worst[:1]:
                print(f"  {r.key} ({r.name}): {_e(err)} ({ratio:.3g} x bound) at {where}")
    if rep.ignored:
        print(f"ignored  keys the format does not know: {', '.join(rep.ignored)}")
    if bad:
        print(f"result   MISMATCH in {len(bad)} of {len(rep.outputs)} outputs: "
              f"{', '.join(r.key for r in bad)}")  # fmt: skip
        return 1
    print(f"result   ok: {len(rep.outputs)} outputs within the rule ({args.rule})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
