"""Figures without pyplot: a library call must not switch the caller's matplotlib backend or keep
figures alive in pyplot's global registry (a notebook's inline backend would be replaced by Agg)."""
from __future__ import annotations


def subplots(figsize: tuple[float, float], dpi: float | None = None, layout: str | None = None, **kw):
    """(figure, axes) drawn on an Agg canvas of their own; saved with ``fig.savefig`` and freed with it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(**kw)
