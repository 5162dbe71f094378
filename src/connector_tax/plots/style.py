"""What every figure shares: one colour per config, the stamp (simulated, or what served the data),
atomic PNG+PDF saves.

Figures are built on matplotlib.figure.Figure directly (no pyplot, no global state); saving
goes through the Agg canvas, so no display is ever needed.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)
from matplotlib import colormaps  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

DPI = 150
_UMASK = os.umask(0)
os.umask(_UMASK)
_MODE = 0o666 & ~_UMASK
SIM_TEXT = "SIMULATED"


class Palette:
    """A fixed map from the study's config order to a qualitative colormap: config i always
    gets colour i, in every figure of the study (tab10 up to 10 configs, tab20 up to 20)."""

    def __init__(self, configs: list[str]) -> None:
        self.variants = list(configs)
        if len(self.variants) <= 9:  # tab10 without its grey (grey marks neutral things: y = x, framework)
            cmap = colormaps["tab10"]
            colors = [cmap(i) for i in range(10) if i != 7]
        else:
            cmap = colormaps["tab20"]
            colors = [cmap(i) for i in range(20)]
        self._colors = {name: colors[i % len(colors)] for i, name in enumerate(self.variants)}

    def __call__(self, name: str) -> Any:
        if name not in self._colors:  # a config found only in the files: next free colour
            self.variants.append(name)
            cmap = colormaps["tab20"]
            self._colors[name] = cmap(len(self.variants) % cmap.N)
        return self._colors[name]


def new_figure(width: float = 8.0, height: float = 5.0) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plain_log(axis: Any) -> None:
    """A log-scaled axis read in plain numbers at 1-2-5 steps: matplotlib's own labels a span of
    less than a decade "6x10^0", or only the decades with nothing between (a 150 µs step on an
    axis labelled 10^3 and 10^4)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def stamp(fig: Figure, simulated: bool, served_by: str | None = None) -> None:
    """Say what served the data: "SIMULATED" across the canvas for the simulator; otherwise the
    server in words in the corner (e.g. "vLLM 0.32.0 on CPU, dummy weights"), so a figure of a
    CPU study is never taken for a GPU's. The corner line gets a strip of its own below the
    layout: drawn over it, it hid the x-axis labels and the legends below the axes."""
    if not simulated:
        if served_by:
            _footer(fig, f"served by {served_by}", 0.005, "left", "0.25", "served-by-stamp")
        return
    fig.text(
        0.5,
        0.5,
        SIM_TEXT,
        fontsize=56,
        color="red",
        alpha=0.13,
        rotation=25,
        ha="center",
        va="center",
        transform=fig.transFigure,
        zorder=0,
        gid="simulated-stamp",
    )
    _footer(fig, "simulated data (backend sim)", 0.995, "right", "red", "simulated-footer")


FOOTER_PT = 7


def _footer(fig: Figure, text: str, x: float, ha: str, color: str, gid: str) -> None:
    """A small line (wrapped to the figure's width) at the bottom, with the layout kept above it."""
    chars = max(40, int(fig.get_figwidth() * 72 / (FOOTER_PT * 0.55)))
    lines = textwrap.wrap(text, chars) or [text]
    fig.text(
        x,
        0.005,
        "\n".join(lines),
        fontsize=FOOTER_PT,
        color=color,
        ha=ha,
        va="bottom",
        transform=fig.transFigure,
        gid=gid,
    )
    engine = fig.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine):
        strip = (len(lines) * FOOTER_PT * 1.25 + 6) / (fig.get_figheight() * 72)
        engine.set(rect=(0, strip, 1, 1 - strip))


LEGEND_HOLDER = "<legend>"


def panels_above_legend(fig: Figure, ncols: int, legend_lines: int) -> tuple[list[Axes], Axes]:
    """`ncols` panels side by side and, below them, an axes-free row that holds the legend.

    A figure legend placed "outside lower center" is drawn at the canvas' bottom edge whatever
    the layout reserves, so the footer (stamp) covered it; a legend inside a row of the layout
    stays above the footer's strip. The row's height follows the legend's lines."""
    grid = fig.add_gridspec(2, ncols, height_ratios=[1.0, 0.05 + 0.045 * legend_lines])
    panels = [fig.add_subplot(grid[0, i]) for i in range(ncols)]
    holder = fig.add_subplot(grid[1, :], label=LEGEND_HOLDER)
    holder.axis("off")
    return panels, holder


def notice(name: str, reason: str, simulated: bool) -> Figure:
    """The file of a figure that could not be drawn: its name and why, in words, no axes."""
    fig = new_figure(7.0, 2.2)
    fig.text(0.5, 0.62, f"{name}: not drawn", ha="center", va="center", fontsize=13, weight="bold", gid="not-drawn")
    fig.text(0.5, 0.35, "\n".join(textwrap.wrap(reason, 90)[:4]), ha="center", va="center", fontsize=9)
    stamp(fig, simulated)
    return fig


def describe(fig: Figure) -> dict[str, Any]:
    """What a reviewer (or a test) checks: titles, axis labels, legend entries."""
    axes = []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            axes.append({"colorbar": True, "ylabel": ax.get_ylabel(), "xlabel": ax.get_xlabel()})
            continue
        legends = [c for c in ax.get_children() if isinstance(c, Legend)]
        if ax.get_label() == LEGEND_HOLDER:  # no data, no axis: only the legend it holds
            axes.append({"legend_holder": True, "legend": [t.get_text() for lg in legends for t in lg.get_texts()]})
            continue
        axes.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "legend": [t.get_text() for lg in legends for t in lg.get_texts()],
            }
        )
    # Matplotlib keeps the suptitle in a private attribute (no public getter before 3.10).
    suptitle = getattr(fig, "_suptitle", None)
    sup = suptitle.get_text() if suptitle is not None else ""
    texts = [t.get_text() for t in fig.texts]
    return {"suptitle": sup, "axes": axes, "texts": texts}


def save(fig: Figure, out_dir: Path, name: str) -> list[str]:
    """Write <name>.png and <name>.pdf atomically; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        final = out_dir / f"{name}.{ext}"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".{ext}", dir=out_dir)
        os.close(fd)
        os.chmod(tmp, _MODE)
        try:
            fig.savefig(tmp, format=ext, dpi=DPI)
            os.replace(tmp, final)
            fig.set_layout_engine("none")  # keep the layout of the first save; do not solve it again
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        paths.append(str(final))
    return paths
