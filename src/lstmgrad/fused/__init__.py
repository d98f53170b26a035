"""The fast CPU engine: GEMMs around disk-cached Numba kernels, run as each call's execution plan
(lstmgrad.planning.plan) says (multi-threaded kernels: fused.walks).

Same functions as :mod:`lstmgrad.reference`; the default engine of the public API.
"""

from .lstm import (
    backward_bytes,
    backward_workspace_slots,
    copy_bytes,
    forward_bytes,
    forward_workspace_slots,
    lstm_backward,
    lstm_forward,
    walk_pack_bytes,
)

__all__ = [
    "lstm_forward",
    "lstm_backward",
    "forward_workspace_slots",
    "backward_workspace_slots",
    "forward_bytes",
    "backward_bytes",
    "copy_bytes",
    "walk_pack_bytes",
]
