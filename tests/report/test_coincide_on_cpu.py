"""Runs whose series coincide (verl_ext/report/coincide.py): equal value for value is found, under any key, grouped;
a difference of 1e-3 is not; ``diva-report`` marks them in the figures and lists them in report.md and
summary.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from report_fixtures import method_runs, training_run

from verl_ext.report.cli import main
from verl_ext.report.coincide import coincident_configs, find_coincident, notes_by_panel, same_series

STEPS = [0, 5, 10, 15]
VALUES = [0.31, 0.42, 0.5, 0.55]


def entry(run, values, panel="mathvista", label=None, steps=STEPS):
    return {"panel": panel, "run": run, "label": label or panel, "steps": list(steps), "values": list(values)}


@pytest.mark.parametrize(
    "other_steps, other_values, same",
    [
        (STEPS, VALUES, True),
        (STEPS, [v * (1 + 1e-12) for v in VALUES], True),  # well within a relative 1e-9
        (STEPS, [v + 1e-3 for v in VALUES], False),
        (STEPS, [*VALUES[:3], VALUES[3] + 1e-3], False),  # one step differs
        ([0, 5, 10, 20], VALUES, False),  # other steps
        (STEPS[:3], VALUES[:3], False),  # fewer steps
    ],
)
def test_same_series(other_steps, other_values, same):
    assert same_series(STEPS, VALUES, other_steps, other_values) is same
    assert same_series(other_steps, other_values, STEPS, VALUES) is same  # symmetric


def test_same_series_edges():
    assert not same_series([0], [0.3], [0], [0.3])  # one point (the validation before training) is never flagged
    assert same_series([1, 2], [0.0, 0.0], [1, 2], [0.0, 0.0])
    assert same_series([1, 2], [np.nan, 0.5], [1, 2], [np.nan, 0.5])
    assert not same_series([1, 2], [np.nan, 0.5], [1, 2], [0.5, 0.5])
    assert not same_series([], [], [], [])


def test_find_coincident_groups_runs_per_panel_across_keys():
    series = [
        entry("GRPO", VALUES),
        entry("DIVA-GRPO", [v + 0.05 for v in VALUES]),
        entry("NC-GRPO", VALUES),
        entry("Durian", VALUES),
        entry("AVSPO", [v + 1e-3 for v in VALUES]),  # close, not the same
        entry("GRPO", VALUES, panel="wemath"),  # another panel: compared only with wemath
        entry("PGPO", [0.1, 0.2, 0.3, 0.4], panel="wemath"),
        entry("GRPO", [0.5, 0.4, 0.3, 0.2], panel="collapse rate", label="grpo/collapse_rate"),
        entry("NC-GRPO", [0.5, 0.4, 0.3, 0.2], panel="collapse rate", label="noise_contrastive_grpo/collapse_rate"),
        # two keys of one run that are equal are not a coincidence of runs
        entry("AVSPO", [0.0, 0.0, 0.0, 0.0], panel="collapse rate", label="avspo/collapse_rate/before"),
        entry("AVSPO", [0.0, 0.0, 0.0, 0.0], panel="collapse rate", label="avspo/collapse_rate/after"),
    ]
    found = find_coincident(series)
    assert [(c.panel, c.runs, c.key, c.points) for c in found] == [
        ("mathvista", ["GRPO", "NC-GRPO", "Durian"], "mathvista", 4),
        ("collapse rate", ["GRPO", "NC-GRPO"], "grpo/collapse_rate = noise_contrastive_grpo/collapse_rate", 4),
    ]
    notes = notes_by_panel(found)
    assert notes[("mathvista", "NC-GRPO")] == ["GRPO", "Durian"]
    assert notes[("collapse rate", "GRPO")] == ["NC-GRPO"]
    assert ("mathvista", "AVSPO") not in notes and ("wemath", "GRPO") not in notes


def test_coincident_configs_of_a_sweep():
    curve = (STEPS, VALUES)
    curves = {
        "grpo": {0: curve, 1: (STEPS, [0.3, 0.4, 0.4, 0.45])},
        "noise_contrastive_grpo": {0: curve, 1: (STEPS, [0.3, 0.4, 0.4, 0.45])},
        "diva_grpo": {0: curve, 1: (STEPS, [0.3, 0.45, 0.5, 0.6])},  # seed 0 alone is the same: not a coincidence
        "grpo_2x": {0: curve},  # other seeds
    }
    assert coincident_configs(curves) == {"grpo": ["noise_contrastive_grpo"], "noise_contrastive_grpo": ["grpo"]}


ACC = {"mathvista": [0.30, 0.40, 0.50, 0.58], "wemath": [0.40, 0.45, 0.52, 0.55]}


def test_report_lists_coincident_runs(tmp_path):
    # NC-GRPO's logs are GRPO's, value for value (its collapse rate under its own key)
    runs = method_runs(tmp_path / "runs", same_as={"NC-GRPO": "GRPO"})
    out = tmp_path / "report"
    assert main([str(runs[name]) for name in runs] + ["--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    found = {(c["figure"], c["panel"]): c for c in summary["coincident"]}
    assert set(found) == {
        ("collapse_rate.png", "collapse rate"),
        ("training.png", "Reward (mean per response)"),
        ("training.png", "Response length"),
        ("validation.png", "mathvista"),
        ("validation.png", "wemath"),
        ("validation.png", "mean"),
    }
    assert all(c["runs"] == ["GRPO", "NC-GRPO"] for c in found.values())
    assert found[("collapse_rate.png", "collapse rate")]["key"] == (
        "grpo/collapse_rate = noise_contrastive_grpo/collapse_rate"
    )
    assert found[("validation.png", "mathvista")] == {
        "figure": "validation.png",
        "panel": "mathvista",
        "key": "mathvista",
        "runs": ["GRPO", "NC-GRPO"],
        "points": 7,
    }
    report = (out / "report.md").read_text()
    assert "## Runs that coincide" in report
    assert "- `validation.png`, mathvista: **GRPO** = **NC-GRPO** (equal at all 7 steps)" in report
    assert "- `training.png`, Reward (mean per response) (`critic/score/mean`): **GRPO** = **NC-GRPO**" in report
    assert "- `validation.png`, mean over benchmarks: **GRPO** = **NC-GRPO**" in report


def test_runs_that_differ_by_1e_3_do_not_coincide(tmp_path):
    close = {source: [v + 1e-3 for v in values] for source, values in ACC.items()}
    grpo = training_run(tmp_path / "grpo", steps=15, val_every=5, accs=ACC, seed=1, diva=False)
    other = training_run(tmp_path / "other", steps=15, val_every=5, accs=close, seed=2, diva=False)
    out = tmp_path / "report"
    assert main([str(grpo), str(other), "--output", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["coincident"] == []
    assert "No series of two runs are equal value for value." in (out / "report.md").read_text()
    # the same logs under two names: every series coincides
    same = training_run(tmp_path / "same", steps=15, val_every=5, accs=ACC, seed=1, diva=False)
    assert main([str(grpo), str(same), "--output", str(out)]) == 0
    found = json.loads((out / "summary.json").read_text())["coincident"]
    assert {c["panel"] for c in found} == {
        "collapse rate",
        "Reward (mean per response)",
        "Response length",
        "mathvista",
        "wemath",
        "mean",
    }


def test_one_run_has_no_coincidence_section(tmp_path):
    grpo = training_run(tmp_path / "grpo", steps=15, val_every=5, accs=ACC, seed=1, diva=False)
    out = tmp_path / "report"
    assert main([str(grpo), "--output", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["coincident"] == []
    assert "Runs that coincide" not in (out / "report.md").read_text()
