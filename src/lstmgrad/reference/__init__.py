"""The reference engine: NumPy loops written line by line from docs/math.md, in float64.

It is the oracle every faster engine is tested against: simple and obviously right.
"""

from .lstm import backward_workspace_slots, forward_workspace_slots, lstm_backward, lstm_forward

__all__ = ["lstm_forward", "lstm_backward", "forward_workspace_slots", "backward_workspace_slots"]
