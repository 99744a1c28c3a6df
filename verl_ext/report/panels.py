"""Small multiples: one panel per run, the baseline run in grey in every other panel, legends off the data.

Two layouts (matplotlib, constrained layout):

- :func:`panel_grid`: one quantity, one panel per run (or per configuration), wrapped in rows of at most
  :data:`MAX_COLUMNS`; all panels share both axes (tick labels on the outer panels only), so that a curve's height
  reads the same in every panel.
- :func:`run_rows`: several quantities, one row per run (its name heads the row), one column per quantity; the
  panels of a column get one y range, all panels one x range (:func:`set_limits`).

In each panel the baseline's curve is drawn first, in :data:`GREY` and under the run's own curves
(:func:`reference`); a panel whose series equals another run's value for value gets a red frame and says so in red,
right of its title (:func:`note_same_as`). Legends go below the figure (:func:`legend_below`) or below a panel
(:func:`panel_legend`), never over the curves.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import ScaledTranslation  # noqa: E402

STEP_LABEL = "training step"
GREY = "0.62"  # the baseline's curve in the other runs' panels
GREY_WIDTH = 2.2
NOTE_COLOUR = "#b2182b"
MAX_COLUMNS = 4
PANEL_SIZE = (3.5, 2.5)  # inches per panel of a grid
ROW_PANEL_SIZE = (4.0, 2.0)  # inches per panel of a run's row
LEGEND_HEIGHT = 0.45  # inches the legend below the figure takes, per line of entries
PANEL_LEGEND_LINE = 0.2  # inches a line of a panel's own legend takes
# tab10 without its grey (index 7): grey is the baseline's
_PALETTE = [plt.get_cmap("tab10")(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]


def run_colour(index: int):
    """The colour of the ``index``-th run (never the baseline's grey)."""
    return _PALETTE[index % len(_PALETTE)]


def grid_shape(count: int, columns: int | None = None) -> tuple[int, int]:
    """``(rows, columns)`` of a grid of ``count`` panels, at most :data:`MAX_COLUMNS` wide."""
    columns = max(1, min(count, columns or MAX_COLUMNS))
    return math.ceil(count / columns), columns


def panel_grid(
    count: int,
    columns: int | None = None,
    size=PANEL_SIZE,
    legend_lines: int = 1,
    panel_legend_lines: int = 0,
    sharey: bool = True,
):
    """A figure of ``count`` panels; returns ``(figure, axes)``, ``axes`` a flat list of ``count`` Axes (row by
    row). Axes are shared (x always, y when ``sharey``); tick labels and axis labels stay on the outer panels only.
    ``legend_lines``: room for the figure's legend; ``panel_legend_lines``: for a legend under each panel."""
    rows, columns = grid_shape(count, columns)
    height = (size[1] + PANEL_LEGEND_LINE * panel_legend_lines) * rows + LEGEND_HEIGHT * legend_lines
    fig, grid = plt.subplots(rows, columns, figsize=(size[0] * columns, height), layout="constrained", squeeze=False)
    axes = [grid[i // columns][i % columns] for i in range(count)]
    for extra in range(count, rows * columns):
        grid[extra // columns][extra % columns].set_visible(False)
    for index, ax in enumerate(axes):
        if index:
            ax.sharex(axes[0])
            if sharey:
                ax.sharey(axes[0])
        # the x tick labels and label where no panel stands below; the y tick labels on the left column (shared y)
        bottom = index + columns >= count
        ax.tick_params(labelbottom=bottom, labelleft=not sharey or index % columns == 0)
        if bottom:
            ax.set_xlabel(STEP_LABEL)
    return fig, axes


def run_rows(row_titles: list[str], column_titles: list[str], size=ROW_PANEL_SIZE, legend_lines: int = 1):
    """A figure of one row per run and one column per quantity: ``(figure, axes, rows)``, ``axes[r][c]`` the panel
    of run ``r`` and quantity ``c``, ``rows[r]`` the row's subfigure (its title names the run: :func:`row_title`).
    x tick labels on the bottom row only; :func:`set_limits` gives the panels of a column one y range, all panels
    one x range (axes of different subfigures are not shared: matplotlib redraws a figure whenever a shared axis of
    another one changes its limits, and during a constrained layout that recursion does not end)."""
    count, columns = len(row_titles), len(column_titles)
    height = (size[1] + 0.35) * count + 0.4 + LEGEND_HEIGHT * legend_lines
    fig = plt.figure(figsize=(size[0] * columns + 0.4, height), layout="constrained")
    # the bottom row also holds the tick labels and the axis label: a little taller, so its panels are not smaller
    ratios = [size[1] + 0.35] * (count - 1) + [size[1] + 0.75]
    subfigures = (
        fig.subfigures(count, 1, squeeze=False, height_ratios=ratios)[:, 0] if count > 1 else [fig.subfigures(1, 1)]
    )
    axes = []
    for r, (sub, title) in enumerate(zip(subfigures, row_titles, strict=True)):
        row = sub.subplots(1, columns, squeeze=False)[0]
        for c, ax in enumerate(row):
            ax.set_title(column_titles[c], fontsize=9)
            ax.tick_params(labelbottom=r == count - 1)
            if r == count - 1:
                ax.set_xlabel(STEP_LABEL)
        row_title(sub, title)
        axes.append(list(row))
    return fig, axes, list(subfigures)


def padded(values, fraction: float = 0.06) -> tuple[float, float] | None:
    """``(low, high)`` around the finite ``values`` with a margin, ``None`` when there are none."""
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    margin = (high - low) * fraction or (abs(high) * fraction or 0.5)
    return low - margin, high + margin


def set_limits(axes: list[list], xs, ys_by_column: list) -> None:
    """One x range over all panels (from ``xs``) and one y range per column (``ys_by_column[c]``: the values)."""
    x = padded(xs, 0.03)
    for c, ys in enumerate(ys_by_column):
        y = padded(ys)
        for row in axes:
            if x is not None:
                row[c].set_xlim(*x)
            if y is not None:
                row[c].set_ylim(*y)


def row_title(subfigure, title: str, note: str | None = None) -> None:
    """The run's name over its row, left-aligned; ``note`` (e.g. "same as GRPO: mathvista") after it in red."""
    subfigure.suptitle(title, x=0.005, ha="left", fontsize=11, fontweight="bold")
    if note:
        subfigure.text(0.995, 0.995, note, ha="right", va="top", fontsize=9, color=NOTE_COLOUR)


def reference(ax, steps, values, label: str | None = None, linestyle: str = "-") -> None:
    """The baseline's curve in grey, under the panel's own curves."""
    ax.plot(steps, values, color=GREY, linewidth=GREY_WIDTH, linestyle=linestyle, zorder=1.5, label=label)


def note_same_as(ax, others: list[str], limit: int = 28, short: bool = False) -> None:
    """Mark a panel whose series equal other runs' value for value: a red frame, and right of its title, in red,
    "same as <runs>" (``short``: "= <runs>", for narrow panels), cut at ``limit`` characters."""
    text = ("= " if short else "same as ") + ", ".join(others)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    ax.set_title(text, loc="right", fontsize=8, color=NOTE_COLOUR)
    for spine in ax.spines.values():
        spine.set_edgecolor(NOTE_COLOUR)
        spine.set_linewidth(1.4)


def same_as_handle() -> Patch:
    return Patch(
        facecolor="none",
        edgecolor=NOTE_COLOUR,
        linewidth=1.4,
        label="red frame: equal to the run named, value for value",
    )


def reference_handle(label: str, linestyle: str = "-") -> Line2D:
    return Line2D([], [], color=GREY, linewidth=GREY_WIDTH, linestyle=linestyle, label=label)


def legend_below(fig, handles: list, columns: int | None = None) -> None:
    """One legend for the whole figure, below its panels."""
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            # entries side by side as the figure's width allows (about 3.4 inches each)
            ncols=columns or max(1, min(len(handles), int(fig.get_figwidth() // 3.4))),
            fontsize=8,
            frameon=False,
        )


def panel_legend(ax, columns: int = 1, fontsize: float = 7) -> None:
    """The panel's own legend, under its x-axis (tick labels cleared), outside the data."""
    if not ax.get_legend_handles_labels()[0]:
        return
    # under the tick labels and the axis label, when the panel has them
    points = 4 + 16 * any(label.get_visible() for label in ax.get_xticklabels()) + 14 * bool(ax.get_xlabel())
    below = ScaledTranslation(0, -points / 72, ax.figure.dpi_scale_trans)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=ax.transAxes + below,
        ncols=columns,
        fontsize=fontsize,
        frameon=False,
        handlelength=2.6,
    )
