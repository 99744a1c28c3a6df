"""Series of a run's metrics and the steps-to-best comparison: pure functions of :class:`~.logs.MetricLog`.

Metric keys read (what the toolkit and verl 0.9.1 log):

=====================================  ===================================================================
key                                    meaning
=====================================  ===================================================================
``*/collapse_rate*``                   fraction of groups whose rewards are all equal, per estimator and group
                                       kind: ``diva/collapse_rate/local`` (prompt groups) and ``/global``
                                       (question groups), ``avspo/collapse_rate/before``, ``codapo/...``
``critic/score/mean``                  mean sequence reward of the step's responses (verl)
``*/accuracy/mean``, ``*/acc/mean``    mean training accuracy, when the trainer logs one (``val-*`` excluded)
``response_length/mean``               mean response length in tokens (verl)
``diva/variant_mix/<kind>``            share of the step's prompts of each variant kind
``diva/variant_fallbacks``             prompts whose planned variant fell back to another kind
``diva/difficulty/mean``               mean difficulty over the questions seen
``val-core/<source>/<var>/mean@N``     validation score per ``data_source`` (verl: ``var`` is ``acc`` when the
                                       reward returns it, else ``reward``; N = samples per prompt)
=====================================  ===================================================================

Steps to the baseline's best (the paper: DIVA reaches GRPO's best validation score in 1.90x fewer steps with one
variant, 2.55x with three): for a benchmark, ``best = max_t acc_base(t)`` reached first at step ``t_base``; the run
reaches it at ``t_run = min{t : acc_run(t) >= best}``; the speed-up is ``t_base / t_run`` (``None`` when the run
never reaches it, when ``t_run = 0``, or when ``t_base = 0``: training never beat the baseline's untrained score, so
there are no steps to save). ``mean`` is the same over the mean of the benchmarks both runs validate, at the
steps where every one of them was validated.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import numpy as np

from verl_ext.report.logs import MetricLog

COLLAPSE_PATTERN = "*/collapse_rate*"
REWARD_KEY = "critic/score/mean"
LENGTH_KEY = "response_length/mean"
ACCURACY_PATTERNS = ("*/accuracy/mean", "*/acc/mean")
VARIANT_MIX_PREFIX = "diva/variant_mix/"
FALLBACK_KEY = "diva/variant_fallbacks"
DIFFICULTY_MEAN_KEY = "diva/difficulty/mean"
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
MEAN = "mean"
TOLERANCE = 1e-9


def series(log: MetricLog, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``key`` over the steps that logged it, ascending steps (int64, float64)."""
    pairs = [(step, values[key]) for step, values in log.steps.items() if key in values]
    steps = np.array([s for s, _ in pairs], dtype=np.int64)
    return steps, np.array([v for _, v in pairs], dtype=np.float64)


def collapse_keys(keys: set[str]) -> list[str]:
    return sorted(k for k in keys if fnmatch.fnmatchcase(k, COLLAPSE_PATTERN) and not k.startswith("val-"))


def accuracy_key(keys: set[str]) -> str | None:
    """The training accuracy key, if the trainer logs one (the first match, sorted, of :data:`ACCURACY_PATTERNS`)."""
    for pattern in ACCURACY_PATTERNS:
        found = sorted(k for k in keys if fnmatch.fnmatchcase(k, pattern) and not k.startswith("val-"))
        if found:
            return found[0]
    return None


def variant_kinds(keys: set[str]) -> list[str]:
    """Variant kinds logged in ``diva/variant_mix/<kind>``: ``original`` first (the stack's base), then by name."""
    kinds = sorted(k[len(VARIANT_MIX_PREFIX) :] for k in keys if k.startswith(VARIANT_MIX_PREFIX))
    return sorted(kinds, key=lambda kind: kind != "original")


def validation_keys(keys: set[str]) -> dict[str, str]:
    """``{data_source: key}``: per benchmark, ``acc`` over ``reward``, then the most samples per prompt."""
    best: dict[str, tuple[int, int, str]] = {}
    for key in keys:
        match = VAL_CORE.match(key)
        if match is None:
            continue
        rank = (1 if match["var"] == "acc" else 0, int(match["n"]))
        if match["source"] not in best or rank > best[match["source"]][:2]:
            best[match["source"]] = (*rank, key)
    return {source: entry[2] for source, entry in sorted(best.items())}


def validation_series(log: MetricLog, sources: list[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{source: (steps, values)}`` for each benchmark (``sources``: these only), plus :data:`MEAN` over them at
    the steps where all of them were validated (when there are two or more)."""
    keys = validation_keys(log.keys())
    if sources is not None:
        keys = {s: k for s, k in keys.items() if s in sources}
    out = {source: series(log, key) for source, key in keys.items()}
    if len(out) > 1:
        common = sorted(set.intersection(*(set(steps.tolist()) for steps, _ in out.values())))
        if common:
            means = [np.mean([log.steps[step][key] for key in keys.values()]) for step in common]
            out[MEAN] = (np.array(common, dtype=np.int64), np.array(means, dtype=np.float64))
    return out


def first_step_reaching(steps: np.ndarray, values: np.ndarray, target: float) -> int | None:
    reached = np.flatnonzero(values >= target - TOLERANCE)
    return int(steps[reached[0]]) if reached.size else None


@dataclass
class StepsToBest:
    """One row of the steps-to-best table: ``run`` against the ``baseline`` on ``benchmark``."""

    benchmark: str
    baseline_best: float
    baseline_step: int
    run_step: int | None  # None: not reached
    run_best: float

    @property
    def speedup(self) -> float | None:
        # t_base = 0: the baseline's best is its score before training, which no step count improves on.
        if self.run_step is None or self.run_step == 0 or self.baseline_step == 0:
            return None
        return self.baseline_step / self.run_step


def steps_to_baseline_best(baseline: MetricLog, run: MetricLog) -> list[StepsToBest]:
    """Rows for the benchmarks both runs validate (and their :data:`MEAN` when there are two or more)."""
    common = sorted(set(validation_keys(baseline.keys())) & set(validation_keys(run.keys())))
    base_series, run_series = validation_series(baseline, common), validation_series(run, common)
    rows = []
    for benchmark in [*common, MEAN] if len(common) > 1 else common:
        if benchmark not in base_series or benchmark not in run_series:
            continue
        (b_steps, b_values), (r_steps, r_values) = base_series[benchmark], run_series[benchmark]
        if not b_values.size or not r_values.size:
            continue
        best = float(b_values.max())
        rows.append(
            StepsToBest(
                benchmark=benchmark,
                baseline_best=best,
                baseline_step=first_step_reaching(b_steps, b_values, best),
                run_step=first_step_reaching(r_steps, r_values, best),
                run_best=float(r_values.max()),
            )
        )
    return rows
