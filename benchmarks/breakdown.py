"""Where the fused engine's time goes, per BENCH shape: python benchmarks/breakdown.py [id ...].

For the backward and the forward of one shape (float32, NumPy only, no PyTorch in the
process): the median time of the call, the time of the same GEMMs run alone with numpy.matmul
in the engine's layouts (the per-step recurrent GEMMs and the big ones), and the time cProfile
attributes to the Numba kernels; the rest is NumPy glue and Python overhead. The parts are
measured separately, so on this noisy machine they add up only roughly (the rest can come out
negative by a few ms).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from functools import partial

import numpy as np
from shapes import SHAPES, make_case

import lstmgrad


def _median_ms(fn, reps: int = 7) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def _kernel_ms(fn, reps: int = 3) -> float:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for k, v in stats.items() if k[0].endswith("kernels.py"))
    return total / reps * 1e3


def _rec_steps(rows_per_step, forward, transposed, w_hh, w_t, hs, dg) -> None:
    for m in rows_per_step:
        if forward and transposed:
            np.matmul(w_hh, hs[:m].T)
        elif forward:
            np.matmul(hs[:m], w_t)
        else:
            np.matmul(dg[:m], w_hh)


def _big_gemms(forward, i_l, xh, w_ih, w_ih_t, dg) -> None:
    if forward:
        np.matmul(xh[:, :i_l], w_ih_t)
    else:
        np.matmul(dg, w_ih)
        np.matmul(dg.T, xh)


def _gemms_ms(sh, rows_per_step, forward: bool) -> tuple[float, float]:
    """(recurrent GEMMs, big GEMMs) alone, float32, every (layer, direction)."""
    rng = np.random.default_rng(0)
    h, g = sh.H, 4 * sh.H
    n = int(sum(rows_per_step))
    transposed = sh.B <= 64 and h >= 256  # as the fused forward does
    rec = big = 0.0
    for layer in range(sh.L):
        i_l = sh.I if layer == 0 else sh.D * sh.H
        w_hh = rng.standard_normal((g, h)).astype(np.float32)
        w_ih = rng.standard_normal((g, i_l)).astype(np.float32)
        dg = rng.standard_normal((n, g)).astype(np.float32)
        xh = rng.standard_normal((n, i_l + h)).astype(np.float32)
        hs = rng.standard_normal((sh.B, h)).astype(np.float32)
        w_t, w_ih_t = np.ascontiguousarray(w_hh.T), np.ascontiguousarray(w_ih.T)
        rec_fn = partial(_rec_steps, rows_per_step, forward, transposed, w_hh, w_t, hs, dg)
        rec += _median_ms(rec_fn, 3) * sh.D
        big += _median_ms(partial(_big_gemms, forward, i_l, xh, w_ih, w_ih_t, dg), 3) * sh.D
    return rec, big


def main(ids: list[str]) -> None:
    print(
        "| shape | pass | total ms | recurrent GEMMs alone | big GEMMs alone | Numba kernels | rest |"
    )
    print("|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        if ids and sh.id not in ids:
            continue
        c = make_case(sh, np.float32)
        kw = {"num_layers": sh.L, "bidirectional": sh.bidirectional}
        hx = [c["h0"], c["c0"]]
        fwd = lstmgrad.lstm_forward(c["x"], c["params"], hx, c["batch_sizes"], **kw)
        args = (
            c["x"],
            hx,
            c["params"],
            c["dy"],
            c["dh"],
            c["dc"],
            *fwd.saved[:7],
            c["batch_sizes"],
        )
        rows = c["batch_sizes"] if c["batch_sizes"] is not None else [sh.B] * sh.T
        bwd = partial(lstmgrad.lstm_backward, *args, **kw)
        fwd_fn = partial(lstmgrad.lstm_forward, c["x"], c["params"], hx, c["batch_sizes"], **kw)
        for name, fn, forward in (("backward", bwd, False), ("forward", fwd_fn, True)):
            total = _median_ms(fn)
            kern = _kernel_ms(fn)
            rec, big = _gemms_ms(sh, rows, forward)
            rest = total - rec - big - kern
            print(
                f"| {sh.id} | {name} | {total:.1f} | {rec:.1f} | {big:.1f} | {kern:.1f} | {rest:.1f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
