"""The report's figures (matplotlib, headless Agg backend). Each ``*_figure`` function takes the runs and returns
``(figure, plotted)`` where ``plotted`` lists every series drawn (``{"panel", "run", "label", "steps", "values"}``;
``figures.json`` of the report), or ``(None, reason)`` when the runs hold nothing to draw.

With several runs every panel overlays them, one colour per run (the first run is the baseline); figures that
cannot overlay (heatmaps, stacked shares) get one row per run.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from verl_ext.report import series as S  # noqa: E402
from verl_ext.report.run import Run  # noqa: E402

STEP_LABEL = "training step"
LINE_STYLES = ("-", "--", ":", "-.")
# One marker per metric of a run (a collapse figure's local and global curves): the legend's samples are short,
# and a dashed line with the same colour and marker as a solid one cannot be told apart there.
MARKERS = ("o", "s", "^", "D", "v", "P")
MAX_LABEL = 48
MAX_TITLE_NAME = 30  # run names in panel titles: two panels side by side must both fit
MAX_TICKS = 12
DPI = 120


def _colour(index: int):
    return plt.get_cmap("tab10")(index % 10)


def _short(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _record(plotted: list, panel: str, run: Run, label: str, steps, values, style: dict | None = None) -> None:
    entry = {
        "panel": panel,
        "run": run.name,
        "label": label,
        "steps": [int(s) for s in steps],
        "values": [float(v) for v in values],
    }
    if style is not None:
        entry["style"] = {key: (list(value) if isinstance(value, tuple) else value) for key, value in style.items()}
    plotted.append(entry)


def _line(ax, steps, values, marker: str = "o", **style) -> None:
    # One point alone would be an invisible line: always mark the points of short series; long series show
    # every n-th marker, so that the curve's marker still names it.
    every = max(1, len(steps) // 30)
    ax.plot(steps, values, marker=marker, markevery=every, markersize=4, linewidth=1.6, **style)


def _finish_axes(ax, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", framealpha=0.85)


# ------------------------------------------------------------------------------------------- collapse rate
def collapse_figure(runs: list[Run]):
    per_run = [(run, S.collapse_keys(run.log.keys())) for run in runs]
    if not any(keys for _, keys in per_run):
        return None, "no collapse-rate metrics (*/collapse_rate*) in the logs"
    fig, ax = plt.subplots(figsize=(8.5, 4.8), layout="constrained")
    plotted: list = []
    for r, (run, keys) in enumerate(per_run):
        for k, key in enumerate(keys):
            steps, values = S.series(run.log, key)
            # Each curve its own (colour, line style, marker): a run's colour (one run: a colour per key), and a
            # line style and marker per key, so a run's local and global curves differ in the legend too.
            style = {
                "color": _colour(k if len(runs) == 1 else r),
                "linestyle": LINE_STYLES[k % len(LINE_STYLES)],
                "marker": MARKERS[k % len(MARKERS)],
            }
            label = key if len(runs) == 1 else f"{_short(run.name)}: {key}"
            _line(ax, steps, values, label=label, **style)
            _record(plotted, "collapse rate", run, key, steps, values, style)
    ax.set_ylim(-0.03, 1.03)
    _finish_axes(ax, "collapse rate (share of groups, all rewards equal)", "Advantage collapse rate per step")
    return fig, plotted


# ---------------------------------------------------------------------------------------------- difficulty
def difficulty_figure(runs: list[Run]):
    with_states = [run for run in runs if run.states.difficulties]
    if not with_states:
        return None, "no difficulty states in the checkpoints (global_step_N/diva_difficulty.json)"
    rows = len(with_states)
    fig, axes = plt.subplots(
        rows, 2, figsize=(12, 3.9 * rows), layout="constrained", squeeze=False, width_ratios=(1.35, 1)
    )
    plotted: list = []
    for row, run in enumerate(with_states):
        heat_ax, mean_ax = axes[row]
        steps = list(run.states.difficulties)
        levels = run.states.levels()
        counts = run.states.counts(levels)
        image = heat_ax.imshow(
            counts,
            origin="lower",
            aspect="auto",
            cmap="viridis",
            interpolation="nearest",
            extent=(-0.5, len(steps) - 0.5, levels[0] - 0.5, levels[-1] + 0.5),
        )
        shown = len(steps) if len(steps) <= MAX_TICKS else 8
        ticks = np.unique(np.linspace(0, len(steps) - 1, shown).round().astype(int))
        heat_ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
        heat_ax.set_yticks(levels)
        heat_ax.set_xlabel("saved step (checkpoint)")
        heat_ax.set_ylabel("difficulty level (1 easy, 9 hard)")
        heat_ax.set_title(f"{_short(run.name, MAX_TITLE_NAME)}: questions per difficulty level", fontsize=11)
        bar = fig.colorbar(image, ax=heat_ax, label="questions", pad=0.01)
        bar.locator = MaxNLocator(integer=True)
        bar.update_ticks()
        if counts.size <= 120:  # few cells: write each count in its cell
            threshold = counts.max() / 2 if counts.size else 0
            for (level_index, column), count in np.ndenumerate(counts):
                colour = "black" if count > threshold else "white"
                heat_ax.text(
                    column, levels[level_index], str(count), ha="center", va="center", fontsize=8, color=colour
                )
        for level, line in zip(levels, counts, strict=True):
            _record(plotted, "difficulty heatmap", run, f"level {level}", steps, line)

        logged_steps, logged = S.series(run.log, S.DIFFICULTY_MEAN_KEY)
        if logged.size:
            _line(mean_ax, logged_steps, logged, color=_colour(0), label="logged each step (questions seen)")
            _record(plotted, "mean difficulty", run, S.DIFFICULTY_MEAN_KEY, logged_steps, logged)
        state_means = [float(v.mean()) if v.size else math.nan for v in run.states.difficulties.values()]
        mean_ax.plot(steps, state_means, "s", color=_colour(1), markersize=6, label="checkpoint state")
        _record(plotted, "mean difficulty", run, "checkpoint state", steps, state_means)
        _finish_axes(mean_ax, "mean difficulty", "mean difficulty")
    return fig, plotted


# ----------------------------------------------------------------------------------------------- variants
def variants_figure(runs: list[Run]):
    with_mix = [run for run in runs if S.variant_kinds(run.log.keys())]
    if not with_mix:
        return None, "no variant-mix metrics (diva/variant_mix/*) in the logs"
    rows = len(with_mix)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.8 * rows), layout="constrained", squeeze=False)
    plotted: list = []
    for row, run in enumerate(with_mix):
        mix_ax, fallback_ax = axes[row]
        kinds = S.variant_kinds(run.log.keys())
        steps = np.array(sorted(run.log.steps), dtype=np.int64)
        steps = steps[[any(S.VARIANT_MIX_PREFIX + k in run.log.steps[s] for k in kinds) for s in steps]]
        shares = np.array([[run.log.steps[s].get(S.VARIANT_MIX_PREFIX + k, 0.0) for s in steps] for k in kinds])
        colours = [_colour(i) for i in range(len(kinds))]
        if len(steps) > 1:
            mix_ax.stackplot(steps, shares, labels=kinds, colors=colours, alpha=0.85)
        else:  # a single step: stacked bars, an area of zero width would not show
            bottom = np.zeros(len(steps))
            for kind, share, colour in zip(kinds, shares, colours, strict=True):
                mix_ax.bar(steps, share, bottom=bottom, label=kind, color=colour, width=0.6)
                bottom += share
        for kind, share in zip(kinds, shares, strict=True):
            _record(plotted, "variant mix", run, kind, steps, share)
        mix_ax.set_ylim(0, 1.0)
        _finish_axes(
            mix_ax, "share of the step's prompts", f"{_short(run.name, MAX_TITLE_NAME)}: variant mix", legend=False
        )
        # The shares fill the whole panel: the legend goes outside, on the right.
        mix_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9)

        f_steps, fallbacks = S.series(run.log, S.FALLBACK_KEY)
        if f_steps.size:
            _line(fallback_ax, f_steps, fallbacks, color=_colour(3))
            _record(plotted, "fallbacks", run, S.FALLBACK_KEY, f_steps, fallbacks)
        else:
            fallback_ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=fallback_ax.transAxes)
        top = max(1.0, float(fallbacks.max()) * 1.1) if f_steps.size else 1.0
        fallback_ax.set_ylim(-0.04 * top, top)
        fallback_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        _finish_axes(fallback_ax, "prompts whose planned variant fell back", "variant fallbacks")
    return fig, plotted


# ----------------------------------------------------------------------------------------------- training
def training_figure(runs: list[Run]):
    panels = []
    for title, ylabel, pick in (
        ("Reward (mean per response)", "reward", lambda keys: S.REWARD_KEY if S.REWARD_KEY in keys else None),
        ("Training accuracy", "accuracy", S.accuracy_key),
        ("Response length", "tokens", lambda keys: S.LENGTH_KEY if S.LENGTH_KEY in keys else None),
    ):
        keys = [pick(run.log.keys()) for run in runs]
        if any(keys):
            panels.append((title, ylabel, keys))
    if not panels:
        return None, "no reward, accuracy or response-length metrics in the logs"
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), layout="constrained", squeeze=False)
    plotted: list = []
    for ax, (title, ylabel, keys) in zip(axes[0], panels, strict=True):
        for r, (run, key) in enumerate(zip(runs, keys, strict=True)):
            if key is None:
                continue
            steps, values = S.series(run.log, key)
            _line(ax, steps, values, color=_colour(r), marker=MARKERS[r % len(MARKERS)], label=_short(run.name))
            _record(plotted, title, run, key, steps, values)
        _finish_axes(ax, ylabel, title, legend=len(runs) > 1)
    return fig, plotted


# --------------------------------------------------------------------------------------------- validation
def validation_figure(runs: list[Run]):
    per_run = [S.validation_series(run.log) for run in runs]
    benchmarks = sorted({b for found in per_run for b in found if b != S.MEAN})
    if not benchmarks:
        return None, "no validation metrics (val-core/<data_source>/...) in the logs"
    if any(S.MEAN in found for found in per_run):
        benchmarks.append(S.MEAN)
    columns = min(3, len(benchmarks))
    rows = math.ceil(len(benchmarks) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.7 * rows), layout="constrained", squeeze=False)
    plotted: list = []
    for index, benchmark in enumerate(benchmarks):
        ax = axes[index // columns][index % columns]
        for r, (run, found) in enumerate(zip(runs, per_run, strict=True)):
            if benchmark not in found:
                continue
            steps, values = found[benchmark]
            _line(ax, steps, values, color=_colour(r), marker=MARKERS[r % len(MARKERS)], label=_short(run.name))
            _record(plotted, benchmark, run, benchmark, steps, values)
        if len(runs) > 1 and benchmark in per_run[0] and per_run[0][benchmark][1].size:
            # The target of the steps-to-best comparison: the baseline's best score.
            best = float(per_run[0][benchmark][1].max())
            ax.axhline(best, color=_colour(0), linestyle=":", linewidth=1.2, label=f"{_short(runs[0].name)} best")
        title = "mean over benchmarks" if benchmark == S.MEAN else benchmark
        _finish_axes(ax, "validation accuracy", title, legend=len(runs) > 1)
    for index in range(len(benchmarks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    return fig, plotted


FIGURES = {
    "collapse_rate.png": ("Advantage collapse rate", collapse_figure),
    "difficulty.png": ("Question difficulty", difficulty_figure),
    "variants.png": ("Variant mix and fallbacks", variants_figure),
    "training.png": ("Reward, accuracy and response length", training_figure),
    "validation.png": ("Validation accuracy per benchmark", validation_figure),
}


def save(fig, path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
