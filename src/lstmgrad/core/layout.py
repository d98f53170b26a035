"""Params indexing and the dimensions record shared by every layer of the package.

Gate blocks along the 4H axis are in PyTorch's order i, f, g, o; the engines slice
them as [0:H], [H:2H], [2H:3H], [3H:4H].
"""

from __future__ import annotations

from dataclasses import dataclass

# Kinds of tensor in one (layer, direction) group of params.
W_IH, W_HH, B_IH, B_HH = 0, 1, 2, 3
_KIND_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def params_per_direction(has_bias: bool) -> int:
    """2 weights, plus 2 biases when ``has_bias``."""
    return 4 if has_bias else 2


def num_params(num_layers: int, bidirectional: bool, has_bias: bool) -> int:
    """Length of the params list: L * D * (4 if has_bias else 2)."""
    return num_layers * (2 if bidirectional else 1) * params_per_direction(has_bias)


def param_index(layer: int, direction: int, kind: int, num_dirs: int, has_bias: bool) -> int:
    """Position of (layer, direction, kind) in PyTorch's ``_flat_weights`` order."""
    n = params_per_direction(has_bias)
    return (layer * num_dirs + direction) * n + kind


def param_name(index: int, num_dirs: int, has_bias: bool) -> str:
    """PyTorch's name of params[index], e.g. ``weight_hh_l0_reverse``."""
    n = params_per_direction(has_bias)
    group, kind = divmod(index, n)
    layer, direction = divmod(group, num_dirs)
    return f"{_KIND_NAMES[kind]}_l{layer}" + ("_reverse" if direction else "")


@dataclass(frozen=True)
class Dims:
    """Sizes of one call: T steps, B batch, I input, H hidden, L layers, D directions."""

    T: int
    B: int
    I: int  # noqa: E741 - the legend's name
    H: int
    L: int
    D: int
    has_bias: bool

    @property
    def G(self) -> int:
        """Width of the gate axis, 4H."""
        return 4 * self.H

    @property
    def K(self) -> int:
        """Number of (layer, direction) pairs, L * D."""
        return self.L * self.D

    def layer_input_size(self, layer: int) -> int:
        """I for layer 0, D*H above."""
        return self.I if layer == 0 else self.D * self.H

    def param_shape(self, index: int) -> tuple[int, ...]:
        """Shape of params[index]: [4H, I or D*H], [4H, H] or [4H]."""
        group, kind = divmod(index, params_per_direction(self.has_bias))
        if kind == W_IH:
            return (self.G, self.layer_input_size(group // self.D))
        return (self.G, self.H) if kind == W_HH else (self.G,)

    def index(self, layer: int, direction: int, kind: int) -> int:
        """Position of (layer, direction, kind) in params."""
        return param_index(layer, direction, kind, self.D, self.has_bias)

    def time_order(self, direction: int) -> range:
        """Steps in the order the forward visits them: 0..T-1, or T-1..0 for the reverse."""
        return range(self.T) if direction == 0 else range(self.T - 1, -1, -1)
