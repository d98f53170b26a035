"""The fast CPU engine: GEMMs around disk-cached Numba kernels (single-threaded, but for the two
directions of small bidirectional layers given as tensors: fused.walks).

Same functions as :mod:`lstmgrad.reference`; the default engine of the public API.
"""

from .lstm import backward_workspace_slots, forward_workspace_slots, lstm_backward, lstm_forward

__all__ = ["lstm_forward", "lstm_backward", "forward_workspace_slots", "backward_workspace_slots"]
