"""Series extraction and the steps-to-best comparison against loop references on random logs."""

from __future__ import annotations

import numpy as np
import pytest

from verl_ext.report import series as S
from verl_ext.report.logs import MetricLog


def log_of(curves: dict[str, dict[int, float]], extra: dict[int, dict] | None = None) -> MetricLog:
    log = MetricLog()
    for source, points in curves.items():
        for step, value in points.items():
            log.steps.setdefault(step, {})[f"val-core/{source}/acc/mean@1"] = value
    for step, values in (extra or {}).items():
        log.steps.setdefault(step, {}).update(values)
    log.steps = dict(sorted(log.steps.items()))
    return log


def reference_first(points: dict[int, float], target: float):
    for step in sorted(points):
        if points[step] >= target - 1e-9:
            return step
    return None


def reference_rows(base: dict[str, dict[int, float]], run: dict[str, dict[int, float]]):
    common = sorted(set(base) & set(run))
    curves = {b: (base[b], run[b]) for b in common}
    if len(common) > 1:

        def mean_curve(c):
            steps = set.intersection(*(set(c[b]) for b in common))
            return {s: sum(c[b][s] for b in common) / len(common) for s in steps}

        curves["mean"] = (mean_curve(base), mean_curve(run))
    rows = []
    for benchmark, (b, r) in curves.items():
        if not b or not r:
            continue
        best = max(b.values())
        t_base, t_run = reference_first(b, best), reference_first(r, best)
        speedup = None if t_run in (None, 0) or t_base == 0 else t_base / t_run
        rows.append((benchmark, best, t_base, t_run, max(r.values()), speedup))
    return rows


def random_curves(rng, sources) -> dict[str, dict[int, float]]:
    steps = sorted(rng.choice(np.arange(0, 200, 5), size=int(rng.integers(1, 15)), replace=False).tolist())
    out = {}
    for source in sources:
        kept = [s for s in steps if rng.uniform() < 0.9] or steps[:1]
        # ties on purpose: a coarse grid of values makes "reached exactly the best" frequent
        out[source] = {int(s): float(rng.integers(0, 12)) / 11 for s in kept}
    return out


@pytest.mark.parametrize("seed", range(60))
def test_steps_to_best_matches_a_loop_reference(seed):
    rng = np.random.default_rng(seed)
    sources = ["mathvista", "mathverse", "wemath"][: int(rng.integers(1, 4))]
    base, run = random_curves(rng, sources), random_curves(rng, sources)
    if rng.uniform() < 0.3:  # the run validates one benchmark fewer
        run.pop(sources[-1])
    rows = S.steps_to_baseline_best(log_of(base), log_of(run))
    got = [(r.benchmark, r.baseline_best, r.baseline_step, r.run_step, r.run_best, r.speedup) for r in rows]
    want = reference_rows(base, run)
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g[1] == pytest.approx(w[1]) and g[2:4] == w[2:4] and g[4] == pytest.approx(w[4])
        assert (g[5] is None and w[5] is None) or g[5] == pytest.approx(w[5])


def test_known_answer_speedup():
    # baseline best 0.6 first at step 300; the run first reaches 0.6 at step 150 -> 2.0x fewer steps
    base = {"mathvista": {0: 0.3, 100: 0.45, 200: 0.55, 300: 0.6, 400: 0.58}}
    run = {"mathvista": {0: 0.3, 100: 0.5, 150: 0.61, 200: 0.64}}
    (row,) = S.steps_to_baseline_best(log_of(base), log_of(run))
    assert (row.baseline_step, row.run_step, row.speedup) == (300, 150, 2.0)
    never = {"mathvista": {0: 0.3, 100: 0.59}}
    (row,) = S.steps_to_baseline_best(log_of(base), log_of(never))
    assert row.run_step is None and row.speedup is None
    # the baseline never beats its untrained score: no steps to save, no ratio (not 0x)
    flat = {"mathvista": {0: 0.6, 100: 0.5, 200: 0.6}}
    (row,) = S.steps_to_baseline_best(log_of(flat), log_of(run))
    assert (row.baseline_step, row.run_step, row.speedup) == (0, 150, None)


def test_validation_keys_prefer_acc_and_the_most_samples():
    keys = {
        "val-core/mathvista/acc/mean@1",
        "val-core/mathvista/acc/mean@4",
        "val-core/mathvista/acc/best@4/mean",
        "val-core/plain/reward/mean@2",
        "val-aux/mathvista/reward/mean@4",
        "val-core/ns/with/slash/acc/mean@1",
    }
    assert S.validation_keys(keys) == {
        "mathvista": "val-core/mathvista/acc/mean@4",
        "ns/with/slash": "val-core/ns/with/slash/acc/mean@1",
        "plain": "val-core/plain/reward/mean@2",
    }


def test_metric_families_are_found_generically():
    keys = {
        "diva/collapse_rate/local",
        "diva/collapse_rate/global",
        "avspo/collapse_rate/before",
        "codapo/collapse_rate",
        "mupo/collapse_rate/partition",
        "diva/advantage/mean",
        "val-core/x/collapse_rate/mean@1",
        "diva/variant_mix/paraphrase",
        "diva/variant_mix/original",
        "mymethod/accuracy/mean",
    }
    assert S.collapse_keys(keys) == sorted(
        [
            "avspo/collapse_rate/before",
            "codapo/collapse_rate",
            "diva/collapse_rate/global",
            "diva/collapse_rate/local",
            "mupo/collapse_rate/partition",
        ]
    )
    assert S.variant_kinds(keys) == ["original", "paraphrase"]
    assert S.accuracy_key(keys) == "mymethod/accuracy/mean"
    assert S.accuracy_key({"val-core/x/acc/mean@1"}) is None
