"""What the experiments' figures share: one colour per system, a row of panels, a JCT-against-x panel with
the paper's readings as crosses, and saving. matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SYSTEM_COLORS", "jct_panel", "panels", "save", "system_colours"]

from dualpath_emu.cluster.systems import SYSTEM_COLORS, system_colours  # one colour per system, everywhere

Points = Sequence[tuple[float, float]]


def panels(count: int, *, width: float = 4.0, height: float = 3.4) -> tuple[Any, list[Any]]:
    """A figure with ``count`` panels side by side: ``(figure, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, list(axes[0])


def jct_panel(ax: Any, series: Mapping[str, Points], *, title: str, xlabel: str,
              paper: Mapping[str, Points] | None = None, log_x: bool = False) -> None:  # fmt: skip
    """JCT against ``xlabel`` per system (lines), the paper's readings per system (crosses)."""
    colours = system_colours(series)
    for system, points in series.items():
        color = colours[system]
        if points:
            ax.plot(*zip(*sorted(points)), "o-", color=color, label=system)
        if paper and paper.get(system):
            ax.plot(*zip(*sorted(paper[system])), "x", color=color, markersize=9, label=f"{system} (paper)")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("JCT (s)")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)


def save(fig: Any, path: Path) -> None:
    """Lay out, write ``path`` and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
