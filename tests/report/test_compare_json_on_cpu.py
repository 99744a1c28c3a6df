"""``comparison.json`` from run folders (``verl_ext.lab.compare``): the entries read from the metrics logs as the
tiny CPU runs write them, and the four claims, which hold or fail on the numbers (never assumed)."""

from __future__ import annotations

import pytest
from report_fixtures import write_log

from verl_ext.lab.compare import claims, method_entry

VAL = "val-core/diva_swatch/acc/mean@1"


def _run(tmp_path, method, prefix, zero, val, extra=None):
    records = [(0, {VAL: val[0]})]
    for step, z in enumerate(zero, start=1):
        data = {"actor/pg_loss": 0.1, f"{prefix}/advantage/zero_fraction": z, **(extra or {}).get(step, {})}
        if step in val:
            data[VAL] = val[step]
        records.append((step, data))
    write_log(tmp_path / method / "metrics" / "diva_grpo" / f"compare_{method}.jsonl", records)
    return tmp_path / method


def test_entries_and_claims(tmp_path):
    grpo = method_entry("grpo", _run(tmp_path, "grpo", "grpo", [0.5, 0.5], {0: 0.3, 2: 0.5}))
    assert grpo == {
        "val_accuracy": [[0, 0.3], [2, 0.5]],
        "zero_advantage_fraction": [[1, 0.5], [2, 0.5]],
        "steps": 2,
    }
    step = {
        "diva/difficulty/mean": 5.0,
        "diva/accuracy/original": 0.5,
        "diva/accuracy/original/responses": 8.0,
        "diva/accuracy/hint": 0.75,
        "diva/accuracy/hint/responses": 4.0,
        "diva/accuracy_gap/hint": 0.25,
        "diva/accuracy/image_perturb": 0.25,
        "diva/accuracy/image_perturb/responses": 4.0,
        "diva/accuracy_gap/image_perturb": -0.5,
        "diva/difficulty/solved_mean": 3.0,
        "diva/difficulty/failed_mean": 7.0,
    }
    diva = method_entry(
        "diva_grpo", _run(tmp_path, "diva_grpo", "diva", [0.25, 0.0], {0: 0.3, 2: 0.45}, {1: step, 2: step})
    )
    assert diva["accuracy_by_variant"] == {"hint": 0.75, "image_perturb": 0.25, "original": 0.5}
    assert diva["accuracy_gap_by_variant"] == {"hint": 0.25, "image_perturb": -0.5}
    assert diva["difficulty_mean"] == [[1, 5.0], [2, 5.0]]
    found = claims({"warm_start": {"val_accuracy": 0.3}, "methods": {"grpo": grpo, "diva_grpo": diva}})
    assert found["diva_zero_advantage_below_grpo"]["held"]
    assert found["image_perturb_harder_hint_easier"]["held"]
    assert found["difficulty_moves_with_accuracy"]["held"]
    # DIVA's best (0.45) is 15 points above the warm start, GRPO's (0.5) 20: both clear the 10-point bar ...
    assert found["best_at_least_10_points_above_warm_start"]["held"]
    # ... and a method 5 points up fails it.
    lower = claims({"warm_start": {"val_accuracy": 0.4}, "methods": {"grpo": grpo, "diva_grpo": diva}})
    assert not lower["best_at_least_10_points_above_warm_start"]["held"]


def test_a_method_that_logs_no_zero_fraction_is_refused(tmp_path):
    run = tmp_path / "grpo"
    write_log(run / "metrics" / "p" / "x.jsonl", [(0, {VAL: 0.3}), (1, {"actor/pg_loss": 0.1})])
    with pytest.raises(ValueError, match="grpo/advantage/zero_fraction"):
        method_entry("grpo", run)
