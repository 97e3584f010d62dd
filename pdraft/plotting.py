"""The two matplotlib steps every pdraft plot shares: pyplot on the Agg backend (files only, no display) and
saving a finished figure as a PNG, written like every pdraft artifact file (pdraft.ledger: an exclusive
temporary renamed into place, never through a link, and listed among the files pdraft wrote there)."""

from __future__ import annotations

from pathlib import Path

from pdraft import ledger


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    fig.tight_layout()
    ledger.write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    pyplot().close(fig)
    return Path(path)
