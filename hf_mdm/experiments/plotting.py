"""The matplotlib set-up the experiments' figures share: headless backend, one panel per language, 120 dpi PNGs.

matplotlib is imported on first use only, so importing the experiments does not load it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

#: Line styles of the measured MDM curves; the trained AR model is a dotted horizontal line.
MDM_STYLES = (("oracle MDM", "-o"), ("trained MDM", "--s"))

Clip = Callable[[float], float]


def _unchanged(value: float) -> float:
    return value


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, title: Optional[str] = None, bottom: float = 0.0) -> None:
    """Lay out, save at 120 dpi and close ``fig``, with ``title`` above all its panels if given and the bottom
    ``bottom`` of the figure (a fraction) left free, e.g. for a figure legend."""
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def language_panels(
    rows: list[dict], path: Path, panel_width: float, title: str, draw: Callable[[Any, str], None]
) -> None:
    """One log-x panel per language of ``rows`` (sorted by name), ``draw(ax, language)`` filling each."""
    import matplotlib.ticker

    names = sorted({r["language"] for r in rows})
    fig, axes = pyplot().subplots(1, len(names), figsize=(panel_width * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        draw(ax, name)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, title)


def mdm_curves(
    ax: Any,
    rows: list[dict],
    name: str,
    x: str,
    y: str,
    clip: Clip = _unchanged,
    interval: Optional[tuple[str, str]] = None,
) -> None:
    """The oracle and trained MDM curves of language ``name``, one per length: ``clip(row[y])`` against ``row[x]``,
    with the rows' 95% interval (the keys ``interval``) as a band (infinite values, e.g. TER with samples outside
    the support, are left out of the plot; the tables keep them)."""
    for model, style in MDM_STYLES:
        for length in sorted({r["length"] for r in rows if r["language"] == name and r["model"] == model}):
            pts = sorted(
                (r[x], r)
                for r in rows
                if r["language"] == name and r["model"] == model and r["length"] == length and math.isfinite(r[y])
            )
            xs = [p[0] for p in pts]
            (line,) = ax.plot(xs, [clip(p[1][y]) for p in pts], style, label=f"{model}, L={length}", ms=4)
            if interval and all(math.isfinite(p[1][interval[1]]) for p in pts):
                ax.fill_between(
                    xs,
                    [clip(p[1][interval[0]]) for p in pts],
                    [clip(p[1][interval[1]]) for p in pts],
                    color=line.get_color(),
                    alpha=0.15,
                    lw=0,
                )


def ar_lines(
    ax: Any, rows: list[dict], name: str, y: str, clip: Clip = _unchanged, interval: Optional[tuple[str, str]] = None
) -> None:
    """The trained AR model of language ``name`` as a dotted horizontal line at ``clip(row[y])``, its 95% interval
    (the keys ``interval``) as a grey band."""
    for r in rows:
        if r["language"] == name and r["model"] == "trained AR" and math.isfinite(r[y]):
            ax.axhline(clip(r[y]), color="k", ls=":", label=f"trained AR, L={r['length']}")
            if interval and math.isfinite(r[interval[1]]):
                ax.axhspan(clip(r[interval[0]]), clip(r[interval[1]]), color="k", alpha=0.08, lw=0)
