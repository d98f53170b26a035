"""Precision of each engine in float32 and float16 against the float64 reference (README table).

python benchmarks/precision.py: random cases T6-B3-I5-H8 with 1-2 layers, uni- and
bidirectional, dense and variable lengths, 6 seeds each. Inputs are drawn in float64, cast to
the low dtype, and the float64 reference runs on the cast values cast back, so the error is
the engine's own. Error = max|got - want| / max|want| over dx, dh_prev, dc_prev and dparams.
"""

from __future__ import annotations

import numpy as np

import lstmgrad

CONFIGS = [(1, 1, False), (2, 2, False), (2, 2, True)]  # L, D, variable lengths
T, B, I, H = 6, 3, 5, 8


def _case(seed, layers, dirs, varlen):
    rng = np.random.default_rng(seed)
    params = []
    for layer in range(layers):
        for _ in range(dirs):
            w_in = I if layer == 0 else dirs * H
            params += [
                rng.uniform(-0.5, 0.5, s) for s in [(4 * H, w_in), (4 * H, H), (4 * H,), (4 * H,)]
            ]
    bs = np.array([3, 3, 2, 2, 1, 1], np.int64) if varlen else None
    x = rng.standard_normal((T * B, I) if varlen else (T, B, I))
    hx = [rng.standard_normal((layers * dirs, B, H)) for _ in range(2)]
    dy = rng.standard_normal((T * B, dirs * H) if varlen else (T, B, dirs * H))
    dh = rng.standard_normal((layers * dirs, B, H))
    return params, x, hx, dy, dh, bs


def _grads(res):
    return [res.dx, res.dh_prev, res.dc_prev, *res.dparams]


def _rel(got, want):
    return max(
        float(
            np.abs(np.asarray(g, np.float64) - w).max(initial=0)
            / max(np.abs(w).max(initial=0), 1e-300)
        )
        for g, w in zip(got, want, strict=True)
    )


def main() -> None:
    print("| engine | dtype | backward alone (same saved activations) | forward + backward |")
    print("|---|---|---|---|")
    for impl in ("fused", "reference"):
        for dtype in (np.float32, np.float16):
            e_bwd = e_fb = 0.0
            for layers, dirs, varlen in CONFIGS:
                kw = {"num_layers": layers, "bidirectional": dirs == 2}
                for seed in range(6):
                    params, x, hx, dy, dh, bs = _case(seed, layers, dirs, varlen)
                    low = [a.astype(dtype) for a in (x, dy, dh)]
                    p_low = [p.astype(dtype) for p in params]
                    hx_low = [a.astype(dtype) for a in hx]
                    up = lambda a: np.asarray(a, np.float64)  # noqa: E731
                    f_low = lstmgrad.lstm_forward(low[0], p_low, hx_low, bs, impl=impl, **kw)
                    f_ref = lstmgrad.lstm_forward(
                        up(low[0]),
                        [up(p) for p in p_low],
                        [up(a) for a in hx_low],
                        bs,
                        impl="reference",
                        **kw,
                    )
                    args_ref = (
                        up(low[0]),
                        [up(a) for a in hx_low],
                        [up(p) for p in p_low],
                        up(low[1]),
                        up(low[2]),
                        up(low[2]),
                    )
                    want = _grads(
                        lstmgrad.lstm_backward(
                            *args_ref, *f_ref.saved[:7], bs, impl="reference", **kw
                        )
                    )
                    # backward alone: the low-precision engine on the saved activations of the
                    # float64 forward cast down; its reference uses the same cast values
                    saved_low = [[a.astype(dtype) for a in lst] for lst in f_ref.saved[:7]]
                    low_args = (low[0], hx_low, p_low, low[1], low[2], low[2])
                    got = _grads(lstmgrad.lstm_backward(*low_args, *saved_low, bs, impl=impl, **kw))
                    saved_up = [[up(a) for a in lst] for lst in saved_low]
                    want_alone = _grads(
                        lstmgrad.lstm_backward(*args_ref, *saved_up, bs, impl="reference", **kw)
                    )
                    e_bwd = max(e_bwd, _rel(got, want_alone))
                    got_fb = _grads(
                        lstmgrad.lstm_backward(*low_args, *f_low.saved[:7], bs, impl=impl, **kw)
                    )
                    e_fb = max(e_fb, _rel(got_fb, want))
            print(f"| {impl} | {np.dtype(dtype).name} | {e_bwd:.1e} | {e_fb:.1e} |")


if __name__ == "__main__":
    main()
