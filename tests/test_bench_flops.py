"""The benchmarks' FLOP formula (benchmarks/shapes.py) against a count written out GEMM by GEMM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from shapes import BY_ID, lstm_flops  # noqa: E402


def mm(m: int, k: int, n: int) -> int:
    """FLOPs of one [m, k] x [k, n] product."""
    return 2 * m * k * n


def test_med6_two_layers_dense():
    # med-6: T100 B64 I512 H512 L2 D1; N = T*B rows, gates 4H = 2048
    sh = BY_ID["med-6"]
    n, g = 100 * 64, 4 * 512
    layer0 = [
        mm(n, g, 512),  # recurrent dh: T products [B, 4H] x [4H, H], N rows in all
        mm(n, g, 512),  # dx: [N, 4H] x [4H, I]
        mm(g, n, 512),  # dW_ih: [4H, N] x [N, I]
        mm(g, n, 512),  # dW_hh: [4H, N] x [N, H]
    ]
    layer1 = [mm(n, g, 512), mm(n, g, 512), mm(g, n, 512), mm(g, n, 512)]  # I_1 = D*H = 512
    backward = sum(layer0) + sum(layer1)
    forward = 2 * (mm(n, 512, g) + mm(n, 512, g))  # x W_ih^T and the recurrent h W_hh^T
    assert sh.flops_backward() == backward == 107_374_182_400
    assert sh.flops_forward() == forward
    assert lstm_flops(n, 512, 512, 2, 1, "fwd_bwd") == backward + forward
    assert sh.flops_backward(dx=False) == backward - mm(n, g, 512)


def test_varlen2_bidirectional_two_layers():
    # varlen-2: T50 B32 I256 H256 L2 D2, lengths in [5, 50]: N = sum of the lengths
    sh = BY_ID["varlen-2"]
    n = int(sh.lengths().sum())
    assert n < 50 * 32
    g, h = 4 * 256, 256
    per_dir0 = mm(n, g, h) + mm(n, g, 256) + mm(g, n, 256) + mm(g, n, h)  # I_0 = I = 256
    per_dir1 = mm(n, g, h) + mm(n, g, 2 * h) + mm(g, n, 2 * h) + mm(g, n, h)  # I_1 = D*H = 512
    backward = 2 * per_dir0 + 2 * per_dir1
    forward = 2 * (mm(n, 256, g) + mm(n, h, g)) + 2 * (mm(n, 2 * h, g) + mm(n, h, g))
    assert sh.flops_backward() == backward
    assert sh.flops_forward() == forward
    assert sh.flops_fwd_bwd() == backward + forward
    # the padded count keeps every one of the T*B rows
    assert sh.flops_backward(effective=False) == backward * 50 * 32 // n


def test_unknown_part_is_rejected():
    with pytest.raises(ValueError):
        lstm_flops(1, 1, 1, 1, 1, "sideways")


def test_the_packaged_bench_counts_the_same():
    from lstmgrad.tools.bench import flops

    for sh in (BY_ID["med-6"], BY_ID["small-2"], BY_ID["large-1"]):
        dims = (sh.T, sh.B, sh.I, sh.H, sh.L, sh.D)
        assert flops(dims, "backward") == sh.flops_backward()
        assert flops(dims, "forward") == sh.flops_forward()
