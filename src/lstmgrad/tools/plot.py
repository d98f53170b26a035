"""``lstmgrad check --plot``: one PNG per output, drawn from its :class:`~.golden.Profile`
(docs/check.md#pictures-of-where-the-error-sits).

The data is computed by :func:`lstmgrad.tools.golden.error_profile`; this module only draws it.
matplotlib is imported when a picture is drawn (the ``dev`` and ``bench`` extras install it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from .golden import CallReport, Profile, Row

EXTRA = "bench"  # the lightest extra that installs matplotlib


def missing() -> str | None:
    """Why pictures cannot be drawn here (matplotlib not installed), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (f"--plot needs matplotlib, which is not installed: pip install "
                f"'lstmgrad[{EXTRA}]' (or matplotlib itself)")  # fmt: skip
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the display
    import matplotlib.pyplot as plt

    return plt


def draw(profile: Profile, path: str | Path, title: str = "") -> Path:
    """Draw ``profile`` into a PNG at ``path``: one panel per axis it has (time steps, batch
    rows, units or gate rows), each curve a layer and direction, the bound as a line at 1.

    Returns:
        The path written.
    """
    plt = _pyplot()
    from matplotlib import ticker

    panels = [(v, axis) for v, axis in ((profile.steps, "time step"), (profile.rows, "batch row"),
                                        (profile.units, profile.unit_axis)) if v]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels) + 0.4, 2.9), dpi=72,
                             squeeze=False)  # fmt: skip
    for ax, (curves, axis) in zip(axes[0], panels, strict=True):
        for name, values in curves.items():
            shown = np.where(np.isfinite(values), values, np.nan)
            shown = np.maximum(shown, 1e-6)  # an exact element sits on the floor of the log axis
            ax.plot(np.arange(len(values)), shown, marker="." if len(values) < 64 else None,
                    linewidth=1, label=name)  # fmt: skip
        ax.axhline(1.0, color="crimson", linestyle="--", linewidth=1, label="bound")
        if profile.gate_size and axis == "gate row":
            for g in range(1, 4):
                ax.axvline(g * profile.gate_size - 0.5, color="grey", linewidth=0.5)
            for g, name in enumerate("ifgo"):
                ax.annotate(f"gate {name}", ((g + 0.5) * profile.gate_size, 1.0),
                            xycoords=("data", "axes fraction"), ha="center", va="top",
                            fontsize=7)  # fmt: skip
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.set_xlabel(axis)
        ax.grid(True, which="major", linewidth=0.3)
    axes[0][0].set_ylabel("largest |error| / bound")
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle(title or f"{profile.key} ({profile.label})", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def _file_name(rep: CallReport, row: Row) -> str:
    where = rep.source.rsplit("/", 1)[0] if "/" in rep.source else rep.source
    name = f"{where}-{row.key}" if where else row.key
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".png"


def write_all(reports: list[CallReport], folder: str | Path, every: bool = False) -> list[Path]:
    """One PNG per failing output (``every``: per judged output) of ``reports`` in ``folder``
    (made if missing).

    Returns:
        The files written.
    """
    folder = Path(folder)
    judged = ("pass", "warning", "error")
    chosen = [(rep, row, row.profile) for rep in reports for row in rep.rows
              if row.profile is not None and (row.failed or (every and row.status in judged))]  # fmt: skip
    if not chosen:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    written, used = [], set()
    for rep, row, profile in chosen:
        name = _file_name(rep, row)
        stem, n = name[:-4], 2
        while name in used:
            name, n = f"{stem}-{n}.png", n + 1
        used.add(name)
        verdict = "FAIL" if row.failed else row.status
        written.append(draw(profile, folder / name, f"{rep.name}: {row.key} ({row.label}), "
                            f"{rep.dtype}: {verdict}"))  # fmt: skip
    return written
