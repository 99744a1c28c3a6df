"""Small multiples with several runs (verl_ext/report/panels.py, figures.py): one panel (or row) per run, the
baseline (GRPO by name, else the first run) in grey in every other panel, legends outside every axes, coincident
series marked in their panel; one run keeps one panel."""

from __future__ import annotations

import json

import matplotlib.colors as mcolors
import numpy as np
import pytest
from report_fixtures import METHOD_COLLAPSE_KEYS, method_runs, training_run

from verl_ext.report import figures as F
from verl_ext.report import panels as P
from verl_ext.report.baseline import baseline_index, is_grpo
from verl_ext.report.run import load_run

ORDER = ["DIVA-GRPO", "GRPO", "AVSPO", "CoDaPO", "Durian", "PGPO", "MUPO", "NC-GRPO"]  # GRPO second


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    paths = method_runs(tmp_path_factory.mktemp("runs"), same_as={"NC-GRPO": "GRPO"})
    return [load_run(paths[name], name) for name in ORDER]


@pytest.mark.parametrize(
    "name, grpo",
    [
        ("GRPO", True),
        ("grpo", True),
        ("qwen25vl7b_grpo_n10", True),
        ("grpo_2x", True),
        ("DIVA-GRPO", False),
        ("diva_grpo", False),
        ("NC-GRPO", False),
        ("noise_contrastive_grpo", False),
        ("qwen25vl7b_diva_v1", False),
        ("grpowise", False),
    ],
)
def test_grpo_by_name(name, grpo):
    assert is_grpo(name) is grpo


def test_baseline_is_grpo_when_present_else_the_first():
    assert baseline_index(["DIVA-GRPO", "AVSPO", "GRPO"]) == 2
    assert baseline_index(["grpo_2x", "diva", "grpo"]) == 2  # the one named exactly grpo first
    assert baseline_index(["diva", "grpo_2x"]) == 1
    assert baseline_index(["DIVA-GRPO", "NC-GRPO"]) == 0


def _grey(line) -> bool:
    return mcolors.same_color(line.get_color(), P.GREY)


def _greys(ax) -> list:
    return [line for line in ax.get_lines() if _grey(line) and line.get_linestyle() == "-"]


def _legends_outside(fig) -> None:
    """Every legend (the panels' and the figure's) is drawn inside the figure and over no axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert box.x0 >= figure_box.x0 - 1 and box.x1 <= figure_box.x1 + 1
        assert box.y0 >= figure_box.y0 - 1 and box.y1 <= figure_box.y1 + 1
        for axes_box in boxes:
            assert not box.overlaps(axes_box), (legend, axes_box)


def test_collapse_rate_one_panel_per_run_with_grpo_grey_in_the_others(eight):
    fig, plotted = F.collapse_figure(eight)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == len(eight) == 8
    assert [ax.get_title(loc="left") for ax in axes] == [
        "GRPO (baseline)" if name == "GRPO" else name for name in ORDER
    ]
    grpo = next(e for e in plotted if e["run"] == "GRPO")
    for ax, run in zip(axes, eight, strict=True):
        greys = _greys(ax)
        if run.name == "GRPO":
            assert greys == []  # the baseline's own panel: its curve in colour
        else:
            (grey,) = greys  # GRPO logs one collapse key
            assert list(grey.get_xdata()) == grpo["steps"] and list(grey.get_ydata()) == grpo["values"]
            assert grey.get_zorder() < min(line.get_zorder() for line in ax.get_lines() if line is not grey)
        own = [line for line in ax.get_lines() if not _grey(line)]
        assert len(own) == len(METHOD_COLLAPSE_KEYS[run.name])
    _legends_outside(fig)


def test_coincident_panels_are_marked(eight):
    fig, _ = F.collapse_figure(eight)
    axes = {ax.get_title(loc="left"): ax for ax in fig.axes}
    assert axes["NC-GRPO"].get_title(loc="right") == "same as GRPO"
    assert axes["GRPO (baseline)"].get_title(loc="right") == "same as NC-GRPO"
    assert mcolors.same_color(axes["NC-GRPO"].spines["left"].get_edgecolor(), P.NOTE_COLOUR)
    for name in ("DIVA-GRPO", "AVSPO", "MUPO"):
        assert axes[name].get_title(loc="right") == ""
    labels = axes["NC-GRPO"].get_legend_handles_labels()[1]
    assert labels == ["noise_contrastive_grpo/collapse_rate (= GRPO)"]


@pytest.mark.parametrize("build, columns", [(F.training_figure, 2), (F.validation_figure, 3)])
def test_rows_per_run_with_grpo_grey(eight, build, columns):
    """Training (reward, response length: no accuracy logged) and validation (two benchmarks and their mean): a
    row per run, a column per quantity, GRPO's curve in grey in every other row."""
    fig, plotted = build(eight)
    axes = fig.axes
    assert len(axes) == len(eight) * columns
    rows = [axes[r * columns : (r + 1) * columns] for r in range(len(eight))]
    for run, row in zip(eight, rows, strict=True):
        for ax in row:
            panel = ax.get_title() or ax.get_title(loc="left")
            panel = "mean" if panel == "mean over benchmarks" else panel
            greys = _greys(ax)
            if run.name == "GRPO":
                assert greys == []
                continue
            reference = next(e for e in plotted if e["run"] == "GRPO" and e["panel"] == panel)
            (grey,) = greys
            assert list(grey.get_ydata()) == reference["values"]
        note = {"NC-GRPO": "= GRPO", "GRPO": "= NC-GRPO"}.get(run.name, "")
        assert [ax.get_title(loc="right") for ax in row] == [note] * columns
    # the panels of a column share one y range, all panels one x range
    for c in range(columns):
        assert len({tuple(np.round(row[c].get_ylim(), 9)) for row in rows}) == 1
    assert len({tuple(np.round(ax.get_xlim(), 9)) for ax in axes}) == 1
    _legends_outside(fig)


def test_one_run_keeps_one_panel(tmp_path):
    acc = {"mathvista": [0.3, 0.4, 0.5], "wemath": [0.4, 0.45, 0.5]}
    run = load_run(training_run(tmp_path / "diva", steps=10, val_every=5, accs=acc, seed=2))
    fig, plotted = F.collapse_figure([run])
    assert len(fig.axes) == 1
    assert {e["label"] for e in plotted} == {"diva/collapse_rate/local", "diva/collapse_rate/global"}
    assert not any(_grey(line) for line in fig.axes[0].get_lines())
    _legends_outside(fig)
    fig, _ = F.training_figure([run])
    assert len(fig.axes) == 2  # reward and response length, side by side
    fig, _ = F.validation_figure([run])
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 3  # two benchmarks and their mean


def test_panel_grid_shape_and_shared_axes():
    fig, axes = P.panel_grid(7)
    assert len(axes) == 7 and P.grid_shape(7) == (2, 4) and P.grid_shape(2) == (1, 2)
    assert sum(ax.get_visible() for ax in fig.axes) == 7  # the eighth cell is hidden
    axes[0].plot([0, 10], [0.0, 2.0])
    fig.canvas.draw()
    assert all(ax.get_ylim() == axes[0].get_ylim() for ax in axes)
    # x labels where no panel stands below: the last row, and the panel over the hidden cell
    assert [bool(ax.get_xlabel()) for ax in axes] == [False, False, False, True, True, True, True]


def test_validation_is_drawn_as_points_never_a_line_across_unvalidated_steps(tmp_path):
    from verl_ext.report.figures import validation_figure
    from verl_ext.report.run import load_run

    metrics = tmp_path / "run" / "logs" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    entries = [(0, 0.0), (3, 1.0), (4, 1.0)]  # before training, at the last step, after a resumed step
    metrics.write_text("".join(json.dumps({"step": s, "data": {"val-core/swatch/acc/mean@1": v}}) + "\n"
                               for s, v in entries))  # fmt: skip
    fig, _ = validation_figure([load_run(tmp_path / "run")])
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert lines and all(line.get_linestyle() == "None" for line in lines)
    assert list(lines[0].get_xdata()) == [0, 3, 4]
