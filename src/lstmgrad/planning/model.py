"""The default plan's cost model: a plan for a class not measured yet, from product speeds
measured at its sizes on the machine in use (:func:`lstmgrad.planning.tune.probe`).

Every arrangement of the step loops is priced from those speeds, for the call's number of
steps, and the cheapest one serves:

- ``library``: the recurrent products by the library, a call per step on all its threads (the
  method with the least preparation + T calls), the gate maths between them on one thread or
  (``library-split``) with the rows split over the threads;
- ``walk``: each direction's step loop in one compiled call on one thread, with the walk
  product fastest alone;
- ``rows`` (one direction): blocks of the batch's rows walking side by side, a thread each;
- ``pairs`` (two directions): both directions walking at once, a thread each.

The side-by-side prices come from walks timed side by side: they share the caches and the
memory's bandwidth, which decides whether splitting pays (a W_hh out of a core's cache is read
by every block every step). The big products take the method the probe timed fastest, the
public one unless another beats it by :data:`PRIVATE_MARGIN`. No threshold of one CPU is
written here: what differs between CPUs (which library is fastest at which size, what a
thread beside another costs) is in the probe.
"""

from __future__ import annotations

from typing import Any

from ..core.layout import Dims

PRIVATE_MARGIN = 1.05
"""A private op (oneDNN's, MKL's packed GEMM) replaces the library's public GEMM for the big
products only where the probe timed it faster by this factor: within it, a draw of the
machine's noise."""


def _fastest(times: dict[str, float]) -> tuple[str, float]:
    name = min(times, key=lambda k: times[k])
    return name, times[name]


def _recurrent(times: dict[str, dict[str, Any]], steps: int) -> tuple[str, float]:
    """The per-step product method with the least preparation + ``steps`` calls, and that
    cost."""

    def cost(method: str) -> float:
        prep = times[method]["prep"]
        return float(prep.get("1", max(prep.values()))) + steps * float(times[method]["call"])

    method = min(times, key=cost)
    return method, cost(method)


def arrangements(probe: dict[str, Any], dims: Dims) -> dict[str, tuple[float, dict[str, Any]]]:
    """Each arrangement's predicted seconds for one layer's forward + backward step loops of
    ``dims`` (T steps, D directions) and its plan fields."""
    t, d = max(dims.T, 1), dims.D
    gate = float(probe["gate"])
    out: dict[str, tuple[float, dict[str, Any]]] = {}
    m_f, c_f = _recurrent(probe["recurrent"]["fwd"], t)
    m_b, c_b = _recurrent(probe["recurrent"]["bwd"], t)
    library = {"walk": False, "fwd_rec": m_f, "bwd_rec": m_b, "threads": 1}
    out["library"] = (d * (c_f + c_b + t * gate), library)
    if "gate_split" in probe:  # the gate maths of every step split over the threads
        out["library-split"] = (d * (c_f + c_b + t * float(probe["gate_split"])),
                                {**library, "threads": int(probe["split_parts"])})  # fmt: skip

    def walk_cost(times: dict[str, float]) -> tuple[str, float]:
        prep = probe.get("walk_prep", {})
        return _fastest({m: s + float(prep.get(m, 0.0)) / t for m, s in times.items()})

    product, step = walk_cost(probe["walk"])
    out["walk"] = (d * t * (step + gate), {"walk": True, "walk_product": product})
    if "rows" in probe and d == 1:
        parts = int(probe["rows_parts"])
        product, step = walk_cost(probe["rows"])
        out["rows"] = (t * (step + gate / parts),
                       {"walk": True, "walk_rows": parts, "threads": parts,
                        "walk_product": product})  # fmt: skip
    if "pairs" in probe and d == 2:
        product, step = walk_cost(probe["pairs"])
        out["pairs"] = (t * (step + gate),
                        {"pair_walks": True, "threads": 2, "walk_product": product})  # fmt: skip
    return out


def big_method(probe: dict[str, Any], public: str) -> str:
    """The big products' method: the probe's fastest, ``public`` unless another beats it by
    :data:`PRIVATE_MARGIN`."""
    times = probe.get("big") or {}
    if public not in times:
        return public
    method, seconds = _fastest(times)
    return method if seconds * PRIVATE_MARGIN <= times[public] else public


def engine_fields(probe: dict[str, Any], dims: Dims, public: str) -> dict[str, Any]:
    """The plan fields of the cheapest arrangement and the big products' method."""
    options = arrangements(probe, dims)
    name = min(options, key=lambda k: options[k][0])
    return {**options[name][1], "big": big_method(probe, public)}
