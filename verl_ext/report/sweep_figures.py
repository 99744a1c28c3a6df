"""A seed sweep's curves as small multiples: one panel per configuration, its mean over seeds and their range.

``curves`` is ``{config: {seed: (steps, values)}}`` (one validation curve per finished run; :mod:`verl_ext.lab.sweep`
builds it). Per configuration, at each step that any of its seeds logged: the mean over the seeds that logged it
(the line) and their minimum and maximum (the band). The baseline configuration's mean is drawn in grey in every
other panel; a configuration whose curve equals another's at every seed (:func:`.coincide.coincident_configs`) says
"same as ..." in its panel. The panels share both axes; the legend stands below them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from verl_ext.report import panels as P
from verl_ext.report.coincide import coincident_configs

BAND_ALPHA = 0.25


def seed_stats(by_seed: Mapping[int, tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, mean, minimum, maximum)`` over the seeds, at every step any seed logged (ascending)."""
    at: dict[int, list[float]] = {}
    for steps, values in by_seed.values():
        for step, value in zip(steps, values, strict=True):
            at.setdefault(int(step), []).append(float(value))
    steps = np.array(sorted(at), dtype=np.int64)
    values = [np.array(at[int(s)]) for s in steps]
    return (
        steps,
        np.array([v.mean() for v in values]),
        np.array([v.min() for v in values]),
        np.array([v.max() for v in values]),
    )


def sweep_figure(curves: Mapping[str, Mapping[int, tuple]], baseline: str, title: str, ylabel: str):
    """The sweep's figure (module docstring); returns ``(figure, axes)``, one Axes per configuration of ``curves``
    (in its order). ``baseline``: the configuration drawn in grey in the others' panels (none when it is absent)."""
    configs = [config for config, by_seed in curves.items() if by_seed]
    if not configs:
        raise ValueError("sweep_figure: no configuration has a curve")
    stats = {config: seed_stats(curves[config]) for config in configs}
    same = coincident_configs({config: curves[config] for config in configs})
    fig, axes = P.panel_grid(len(configs))
    for index, (ax, config) in enumerate(zip(axes, configs, strict=True)):
        if config != baseline and baseline in stats:
            steps, mean, _, _ = stats[baseline]
            P.reference(ax, steps, mean)
        steps, mean, low, high = stats[config]
        colour = P.run_colour(index)
        ax.fill_between(steps, low, high, color=colour, alpha=BAND_ALPHA, linewidth=0, zorder=2)
        ax.plot(steps, mean, color=colour, linewidth=1.8, marker="o", markersize=3, zorder=3)
        seeds = len(curves[config])
        name = config + (" (baseline)" if config == baseline else "")
        ax.set_title(f"{name}, {seeds} seed{'s' if seeds != 1 else ''}", loc="left", fontsize=10)
        if config in same:
            P.note_same_as(ax, same[config], limit=24)
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    fig.supylabel(ylabel, fontsize=10)
    fig.suptitle(title, fontsize=12)
    handles = [
        Line2D([], [], color="0.15", linewidth=1.8, marker="o", markersize=3, label="mean over seeds"),
        Patch(color="0.15", alpha=BAND_ALPHA, linewidth=0, label="min to max over seeds"),
    ]
    if baseline in stats:
        handles.append(P.reference_handle(f"{baseline}: mean over seeds (baseline), in every other panel"))
    if same:
        handles.append(P.same_as_handle())
    P.legend_below(fig, handles)
    return fig, axes
