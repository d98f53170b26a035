"""Whether the engine's multi-threaded kernels (fused.walks, on Numba's OpenMP layer) may run in
this process, and on how many threads: a fact the planner reads before it gives a plan more
than one thread.

They run only where Numba's threading layer is GNU OpenMP, the runtime torch uses: another
layer, or an LLVM or Intel OpenMP runtime loaded beside it, would keep a pool of threads
spinning against torch's.
"""

from __future__ import annotations

import os
import sys

import numba
import numpy as np
from numba import prange

from ..core.machine import numba_threads

_decided: tuple[int, bool] | None = None  # (pid, answer) of the process that decided


def pairs_available() -> bool:
    """Whether the pair walks pay here: Numba's threading layer is OpenMP and no OpenMP runtime
    but GNU's is loaded (Linux; False elsewhere, and False where another layer was chosen, e.g.
    NUMBA_THREADING_LAYER=tbb or workqueue). Decided once a process, at the first call, which
    also makes Numba pick its threading layer (as its first parallel function would).

    A process forked after that answers False: GNU OpenMP is not fork-safe, and Numba stops a
    forked child that launches a parallel region of its parent's OpenMP layer; such a child
    walks one direction at a time."""
    global _decided
    pid = os.getpid()
    if _decided is None:
        _decided = (pid, _check_pairs())
    owner, answer = _decided
    return answer and owner == pid


def parallel_threads() -> int:
    """Threads the multi-threaded kernels may use in the calling thread: 1 where they must not
    run (:func:`pairs_available` is False), else Numba's thread count (NUMBA_NUM_THREADS,
    numba.set_num_threads) capped by the CPUs this process may use."""
    if not pairs_available():
        return 1
    return numba_threads()


@numba.njit(parallel=True, cache=True)
def _probe(a):  # pragma: no cover
    for j in prange(a.shape[0]):
        a[j] = j


def _check_pairs() -> bool:
    # Starting Numba's OpenMP pool sets the calling thread's OpenMP thread count to Numba's
    # (seen through torch.get_num_threads()): a count torch was given is put back.
    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else 0
    try:
        _probe(np.zeros(2))
        if numba.threading_layer() != "omp":
            return False
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if ".so" in line}
    except Exception:  # no threading layer loads, no /proc: walk one direction at a time
        return False
    finally:
        if torch is not None and torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
    return not any("libiomp" in lib or "/libomp" in lib for lib in libs)
