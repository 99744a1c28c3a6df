"""The sweep's figure (verl_ext/report/sweep_figures.py): a panel per configuration, the mean over seeds as a line,
their minimum and maximum as a band, the baseline's mean in grey in every other panel, shared y-axis, the legend
below the panels; verl_ext.lab.sweep writes it from the sweep's summary."""

from __future__ import annotations

import matplotlib.colors as mcolors
import numpy as np
import pytest
from PIL import Image

from verl_ext.report import panels as P
from verl_ext.report.sweep_figures import seed_stats, sweep_figure

STEPS = [0, 4, 8]
CURVES = {
    "grpo": {0: (STEPS, [0.3, 0.5, 0.6]), 1: (STEPS, [0.3, 0.4, 0.4]), 2: (STEPS, [0.3, 0.45, 0.5])},
    "diva_grpo": {0: (STEPS, [0.3, 0.6, 0.55]), 1: (STEPS, [0.3, 0.35, 0.38])},
    "avspo": {0: (STEPS, [0.3, 0.2, 0.7])},
}


def _band(ax) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, low, high)`` of the panel's fill_between band."""
    (band,) = ax.collections
    vertices = np.concatenate([path.vertices for path in band.get_paths()])
    steps = np.unique(vertices[:, 0])
    # the polygon's lowest and highest point at each step
    return steps, *np.array(
        [(vertices[vertices[:, 0] == x, 1].min(), vertices[vertices[:, 0] == x, 1].max()) for x in steps]
    ).T


def test_one_panel_per_configuration_mean_line_and_min_max_band():
    fig, axes = sweep_figure(CURVES, "grpo", "a sweep", "validation accuracy")
    assert len(axes) == 3 and sum(ax.get_visible() for ax in fig.axes) == 3
    assert [ax.get_title(loc="left") for ax in axes] == [
        "grpo (baseline), 3 seeds",
        "diva_grpo, 2 seeds",
        "avspo, 1 seed",
    ]
    for ax, config in zip(axes, CURVES, strict=True):
        values = np.array([v for _, v in CURVES[config].values()])
        steps, low, high = _band(ax)
        assert steps.tolist() == STEPS
        assert low == pytest.approx(values.min(axis=0)) and high == pytest.approx(values.max(axis=0))
        (mean,) = [line for line in ax.get_lines() if not mcolors.same_color(line.get_color(), P.GREY)]
        assert list(mean.get_xdata()) == STEPS and list(mean.get_ydata()) == pytest.approx(values.mean(axis=0))


def test_baseline_mean_grey_in_every_other_panel_and_shared_y():
    fig, axes = sweep_figure(CURVES, "grpo", "a sweep", "validation accuracy")
    grpo_mean = np.mean([v for _, v in CURVES["grpo"].values()], axis=0)
    for ax, config in zip(axes, CURVES, strict=True):
        greys = [line for line in ax.get_lines() if mcolors.same_color(line.get_color(), P.GREY)]
        if config == "grpo":
            assert greys == []
        else:
            (grey,) = greys
            assert list(grey.get_ydata()) == pytest.approx(grpo_mean)
    fig.canvas.draw()
    assert len({ax.get_ylim() for ax in axes}) == 1
    # the legend below the panels, over none of them
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in axes)
    assert box.y1 <= min(ax.get_window_extent().y0 for ax in axes)
    assert "grpo: mean over seeds (baseline), in every other panel" in [t.get_text() for t in legend.get_texts()]


def test_seeds_with_other_steps_and_no_baseline():
    steps, mean, low, high = seed_stats({0: ([0, 2, 4], [0.1, 0.2, 0.3]), 1: ([0, 2], [0.3, 0.4])})
    assert steps.tolist() == [0, 2, 4]  # every step a seed logged; the mean over the seeds that logged it
    assert mean == pytest.approx([0.2, 0.3, 0.3]) and low == pytest.approx([0.1, 0.2, 0.3])
    assert high == pytest.approx([0.3, 0.4, 0.3])
    fig, axes = sweep_figure({"diva_grpo": CURVES["diva_grpo"]}, "grpo", "t", "y")  # no grpo: no grey
    assert len(axes) == 1 and not [line for line in axes[0].get_lines() if mcolors.same_color(line.get_color(), P.GREY)]
    with pytest.raises(ValueError, match="no configuration"):
        sweep_figure({"grpo": {}}, "grpo", "t", "y")


def test_configurations_that_coincide_are_marked():
    curves = {**CURVES, "noise_contrastive_grpo": CURVES["grpo"]}
    _, axes = sweep_figure(curves, "grpo", "a sweep", "validation accuracy")
    notes = [ax.get_title(loc="right") for ax in axes]
    assert notes[1:] == ["", "", "same as grpo"]
    assert notes[0].startswith("same as noise_contrast") and notes[0].endswith("…")  # cut to fit beside the title


def test_the_sweep_writes_its_figures(tmp_path):
    from verl_ext.lab.sweep_table import figures

    summary = {
        "runs": {
            config: {
                str(seed): {"curves": {"sampled": [list(s), list(v)], "greedy": [list(s), [x / 2 for x in v]]}}
                for seed, (s, v) in by_seed.items()
            }
            for config, by_seed in CURVES.items()
        }
    }
    written = figures(tmp_path, summary)
    assert written == [str(tmp_path / "sweep_sampled.png"), str(tmp_path / "sweep_greedy.png")]
    for path in written:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width > 800
