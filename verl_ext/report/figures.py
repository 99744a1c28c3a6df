"""The report's figures (matplotlib, headless Agg backend). Each ``*_figure`` function takes the runs and returns
``(figure, plotted)`` where ``plotted`` lists every series drawn once (``{"panel", "run", "label", "steps",
"values"}``; ``figures.json`` of the report; ``panel`` names the quantity: a benchmark, the reward, the collapse
rate), or ``(None, reason)`` when the runs hold nothing to draw.

One run: its curves, one panel per quantity. Several runs: small multiples (:mod:`.panels`), one panel per run for
the collapse rate, a row per run and a column per quantity for training and validation; the baseline run (GRPO
when one is, :mod:`.baseline`) in grey in every other run's panel; a series equal to another run's value for value
(:mod:`.coincide`) is marked "same as <run>" in its panel and listed by :func:`coincident`. Figures that cannot
overlay (heatmaps, stacked shares) get one row per run. Legends stand outside the axes.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from verl_ext.report import coincide as C  # noqa: E402
from verl_ext.report import panels as P  # noqa: E402
from verl_ext.report import series as S  # noqa: E402
from verl_ext.report.baseline import baseline_index  # noqa: E402
from verl_ext.report.run import Run  # noqa: E402

STEP_LABEL = P.STEP_LABEL
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


def _points(ax, steps, values, marker: str = "o", **style) -> None:
    # Validation scores are measured at a few steps only (before training, every test_freq steps, at the end):
    # points, not a line, which would draw values at steps that were never validated.
    ax.plot(steps, values, marker=marker, linestyle="none", markersize=5, **style)


def _finish_axes(ax, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    if legend:
        _legend_right(ax)


# ------------------------------------------------------------------------------------------- collapse rate
COLLAPSE_PANEL = "collapse rate"
COLLAPSE_LABEL = "collapse rate (share of groups, all rewards equal)"


def collapse_figure(runs: list[Run]):
    per_run = [(run, S.collapse_keys(run.log.keys())) for run in runs]
    if not any(keys for _, keys in per_run):
        return None, "no collapse-rate metrics (*/collapse_rate*) in the logs"
    plotted: list = []
    for r, (run, keys) in enumerate(per_run):
        for k, key in enumerate(keys):
            steps, values = S.series(run.log, key)
            # Each curve its own (colour, line style, marker): a run's colour (one run: a colour per key), and a
            # line style and marker per key, so a run's local and global curves differ in the legend too.
            style = {
                "color": _colour(k) if len(runs) == 1 else P.run_colour(r),
                "linestyle": LINE_STYLES[k % len(LINE_STYLES)],
                "marker": MARKERS[k % len(MARKERS)],
            }
            _record(plotted, COLLAPSE_PANEL, run, key, steps, values, style)
    if len(runs) == 1:
        fig, ax = plt.subplots(figsize=(9.5, 4.8), layout="constrained")
        for entry in plotted:
            _line(ax, entry["steps"], entry["values"], label=entry["label"], **_style(entry))
        ax.set_ylim(-0.03, 1.03)
        _finish_axes(ax, COLLAPSE_LABEL, "Advantage collapse rate per step", legend=False)
        _legend_right(ax)
        return fig, plotted

    base = baseline_index([run.name for run in runs])
    same = C.same_as(C.find_coincident(plotted))
    fig, axes = P.panel_grid(len(runs), panel_legend_lines=max(len(keys) for _, keys in per_run))
    baseline_series = [e for e in plotted if e["run"] == runs[base].name]
    for r, (ax, (run, keys)) in enumerate(zip(axes, per_run, strict=True)):
        if r != base:
            for k, entry in enumerate(baseline_series):
                P.reference(ax, entry["steps"], entry["values"], linestyle=LINE_STYLES[k % len(LINE_STYLES)])
        others: list[str] = []
        for entry in (e for e in plotted if e["run"] == run.name):
            also = same.get((COLLAPSE_PANEL, run.name, entry["label"]), [])
            label = entry["label"] + (f" (= {', '.join(also)})" if also else "")
            _line(ax, entry["steps"], entry["values"], label=label, **_style(entry))
            others += [o for o in also if o not in others]
        if not keys:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.4")
        _panel_title(ax, run, r == base, len(runs))
        if others:
            P.note_same_as(ax, others)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        P.panel_legend(ax)
    fig.supylabel("share of groups, all rewards equal", fontsize=9)
    fig.suptitle("Advantage collapse rate per step", fontsize=12)
    handles = [
        P.reference_handle(f"{_short(runs[base].name)} (baseline): {entry['label']}", LINE_STYLES[k % len(LINE_STYLES)])
        for k, entry in enumerate(baseline_series)
    ]
    if same:
        handles.append(P.same_as_handle())
    P.legend_below(fig, handles)
    return fig, plotted


def _style(entry: dict) -> dict:
    return {key: (tuple(v) if isinstance(v, list) else v) for key, v in entry["style"].items()}


def _panel_title(ax, run: Run, is_baseline: bool, count: int) -> None:
    name = _short(run.name, MAX_TITLE_NAME)
    ax.set_title(name + (" (baseline)" if is_baseline and count > 1 else ""), loc="left", fontsize=10)


def _legend_right(ax) -> None:
    """The legend right of the axes, outside the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9)


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
        _legend_right(mix_ax)

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
    plotted: list = []
    for title, _, keys in panels:
        for run, key in zip(runs, keys, strict=True):
            if key is not None:
                _record(plotted, title, run, key, *S.series(run.log, key))
    if len(runs) == 1:
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), layout="constrained", squeeze=False)
        for ax, (title, ylabel, _) in zip(axes[0], panels, strict=True):
            for entry in (e for e in plotted if e["panel"] == title):
                _line(ax, entry["steps"], entry["values"], color=_colour(0))
            _finish_axes(ax, ylabel, title, legend=False)
        return fig, plotted
    fig = _run_rows(runs, [title for title, _, _ in panels], plotted, "Reward, accuracy and response length")
    return fig, plotted


# --------------------------------------------------------------------------------------------- validation
def validation_figure(runs: list[Run]):
    per_run = [S.validation_series(run.log) for run in runs]
    benchmarks = sorted({b for found in per_run for b in found if b != S.MEAN})
    if not benchmarks:
        return None, "no validation metrics (val-core/<data_source>/...) in the logs"
    if any(S.MEAN in found for found in per_run):
        benchmarks.append(S.MEAN)
    plotted: list = []
    for benchmark in benchmarks:
        for run, found in zip(runs, per_run, strict=True):
            if benchmark in found:
                _record(plotted, benchmark, run, benchmark, *found[benchmark])
    titles = ["mean over benchmarks" if b == S.MEAN else b for b in benchmarks]
    if len(runs) == 1:
        columns = min(3, len(benchmarks))
        rows = math.ceil(len(benchmarks) / columns)
        fig, axes = plt.subplots(
            rows, columns, figsize=(4.8 * columns, 3.7 * rows), layout="constrained", squeeze=False
        )
        for index, (entry, title) in enumerate(zip(plotted, titles, strict=True)):
            ax = axes[index // columns][index % columns]
            _points(ax, entry["steps"], entry["values"], color=_colour(0))
            _finish_axes(ax, "validation accuracy", title, legend=False)
        for index in range(len(benchmarks), rows * columns):
            axes[index // columns][index % columns].set_visible(False)
        return fig, plotted
    # The target of the steps-to-best comparison: the baseline's best score, dotted in every panel.
    base = runs[baseline_index([run.name for run in runs])]
    best = {e["panel"]: max(e["values"]) for e in plotted if e["run"] == base.name and e["values"]}
    fig = _run_rows(
        runs,
        titles,
        plotted,
        "Validation accuracy per benchmark",
        panels=benchmarks,
        size=(2.6, 1.8),
        best=best,
        draw=_points,
    )
    return fig, plotted


def _run_rows(runs, titles, plotted, suptitle, panels=None, size=P.ROW_PANEL_SIZE, best=None, draw=None):
    """Small multiples of several quantities: a row per run, a column per quantity (``panels``: their names in
    ``plotted``, default ``titles``); the baseline in grey in the other rows' panels, notes where runs coincide;
    ``best``: ``{panel: value}`` drawn dotted grey in every panel (the baseline's best)."""
    panels, best = panels or titles, best or {}
    base = baseline_index([run.name for run in runs])
    same = C.same_as(C.find_coincident(plotted))
    rows = [_short(run.name, 60) + (" (baseline)" if r == base else "") for r, run in enumerate(runs)]
    fig, axes, subfigures = P.run_rows(rows, titles, size=size)
    by_key = {(e["panel"], e["run"]): e for e in plotted}
    for r, run in enumerate(runs):
        coincide_in: dict[str, list[str]] = {}  # the row's note: {other run: [quantities]}
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            reference = by_key.get((panel, runs[base].name))
            if r != base and reference is not None:
                P.reference(ax, reference["steps"], reference["values"])
            if panel in best:
                ax.axhline(best[panel], color=P.GREY, linestyle=":", linewidth=1.3, zorder=1.4)
            entry = by_key.get((panel, run.name))
            if entry is None:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.4")
            else:
                (draw or _line)(
                    ax, entry["steps"], entry["values"], color=P.run_colour(r), marker=MARKERS[r % len(MARKERS)]
                )
                others = same.get((panel, run.name, entry["label"]), [])
                if others:  # the quantity's name moves left, the note stands right of it
                    ax.set_title("", loc="center")
                    ax.set_title(titles[c], loc="left", fontsize=9)
                    P.note_same_as(ax, others, limit=int(size[0] * 5), short=True)
                    for other in others:
                        coincide_in.setdefault(other, []).append(titles[c])
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.tick_params(labelsize=8)
        if coincide_in:
            note = "; ".join(
                f"same as {other} in " + ("every panel" if len(where) == len(panels) else ", ".join(where))
                for other, where in coincide_in.items()
            )
            P.row_title(subfigures[r], rows[r], note)
    P.set_limits(
        axes,
        [step for entry in plotted for step in entry["steps"]],
        [
            [v for e in plotted if e["panel"] == panel for v in e["values"]] + ([best[panel]] if panel in best else [])
            for panel in panels
        ],
    )
    fig.suptitle(suptitle, fontsize=12)
    name = _short(runs[base].name)
    handles = [P.reference_handle(f"{name} (baseline), in every other row")]
    if best:
        handles.append(P.reference_handle(f"{name}'s best (the steps-to-best target)", ":"))
    if same:
        handles.append(P.same_as_handle())
    P.legend_below(fig, handles)
    return fig


def coincident(file: str, plotted: list) -> list[dict]:
    """The coincident series of a figure of :data:`COMPARED` (``[]`` for the others), as ``{"figure", "panel",
    "key", "runs", "points"}``."""
    if file not in COMPARED:
        return []
    return [{"figure": file, **found.as_dict()} for found in C.find_coincident(plotted)]


FIGURES = {
    "collapse_rate.png": ("Advantage collapse rate", collapse_figure),
    "difficulty.png": ("Question difficulty", difficulty_figure),
    "variants.png": ("Variant mix and fallbacks", variants_figure),
    "training.png": ("Reward, accuracy and response length", training_figure),
    "validation.png": ("Validation accuracy per benchmark", validation_figure),
}


# The figures whose series compare the runs; the heatmap and the stacked shares are each run's own.
COMPARED = ("collapse_rate.png", "training.png", "validation.png")


def save(fig, path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
