"""The two matplotlib steps every pdraft plot shares: pyplot on the Agg backend (files only, no display) and
saving a finished figure as a PNG."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)
