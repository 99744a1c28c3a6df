"""``report.md`` (figures embedded, a short table per section) and ``summary.json`` (the same figures, for scripts)."""

from __future__ import annotations

import numpy as np

from verl_ext.report import series as S
from verl_ext.report.baseline import baseline_index
from verl_ext.report.run import Run


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _last(run: Run, key: str | None) -> tuple[float | None, int | None]:
    if key is None:
        return None, None
    steps, values = S.series(run.log, key)
    return (float(values[-1]), int(steps[-1])) if values.size else (None, None)


def _cell(run: Run, key: str | None, digits: int = 3) -> str:
    value, step = _last(run, key)
    return "–" if value is None else f"{value:.{digits}f} (step {step})"


def summary_rows(runs: list[Run]) -> list[tuple[str, list[str]]]:
    """``(label, one cell per run)``: last values of the headline metrics, best validation accuracy per benchmark."""
    rows = [
        ("last step logged", [str(max(run.log.steps)) if run.log.steps else "–" for run in runs]),
        ("checkpoints with a difficulty state", [str(len(run.states.difficulties)) for run in runs]),
    ]
    for key in sorted({k for run in runs for k in S.collapse_keys(run.log.keys())}):
        rows.append((f"`{key}` (last)", [_cell(run, key) for run in runs]))
    rows.append(("mean difficulty (last)", [_cell(run, S.DIFFICULTY_MEAN_KEY, 2) for run in runs]))
    rows.append(("reward (last)", [_cell(run, S.REWARD_KEY) for run in runs]))
    rows.append(("training accuracy (last)", [_cell(run, S.accuracy_key(run.log.keys())) for run in runs]))
    rows.append(("response length (last)", [_cell(run, S.LENGTH_KEY, 0) for run in runs]))
    found = [S.validation_series(run.log) for run in runs]
    for benchmark in sorted({b for f in found for b in f}, key=lambda b: (b == S.MEAN, b)):
        cells = []
        for f in found:
            if benchmark not in f or not f[benchmark][1].size:
                cells.append("–")
                continue
            steps, values = f[benchmark]
            best = int(np.argmax(values))
            cells.append(f"{values[best]:.3f} (step {steps[best]})")
        label = "mean over benchmarks" if benchmark == S.MEAN else benchmark
        rows.append((f"best validation accuracy: {label}", cells))
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def baseline(runs: list[Run]) -> Run:
    """The run the others are compared with: GRPO when one is, by its name, else the first (:mod:`.baseline`)."""
    return runs[baseline_index([run.name for run in runs])]


def steps_to_best_rows(runs: list[Run]) -> list[tuple[str, S.StepsToBest]]:
    base = baseline(runs)
    return [(run.name, row) for run in runs if run is not base for row in S.steps_to_baseline_best(base.log, run.log)]


def coincident_lines(coincident: list[dict]) -> list[str]:
    """The report's list of series that coincide (``figures.coincident`` entries)."""
    lines = []
    for found in coincident:
        runs = " = ".join(f"**{run}**" for run in found["runs"])
        panel = "mean over benchmarks" if found["panel"] == S.MEAN else found["panel"]
        where = panel if found["key"] == found["panel"] else f"{panel} (`{found['key']}`)"
        lines.append(f"- `{found['figure']}`, {where}: {runs} (equal at all {found['points']} steps)")
    return lines


def write_report(
    runs: list[Run], figures: dict[str, tuple[str, str | None]], notes: list[str], coincident: list[dict] | None = None
) -> str:
    """The markdown text. ``figures``: ``{file: (title, None or the reason it was skipped)}``; ``coincident``: the
    series of two or more runs that are equal value for value (:func:`verl_ext.report.figures.coincident`)."""
    names = [run.name for run in runs]
    base = baseline(runs)
    lines = ["# DIVA-GRPO run report", ""]
    lines += _table(
        ["run", "path", "log files", "steps logged"],
        [
            [
                f"**{r.name}**" + (" (baseline)" if r is base and len(runs) > 1 else ""),
                f"`{r.path}`",
                str(len(r.log.files)),
                str(len(r.log.steps)),
            ]
            for r in runs
        ],
    )
    lines += ["", "## Summary", ""]
    lines += _table(["metric", *names], [[label, *cells] for label, cells in summary_rows(runs)])
    if len(runs) > 1:
        lines += ["", f"## Steps to reach the baseline's best validation accuracy (baseline: {base.name})", ""]
        rows = steps_to_best_rows(runs)
        if rows:
            table = []
            for name, row in rows:
                reached = "not reached" if row.run_step is None else f"step {row.run_step}"
                if row.speedup is not None:
                    speedup = f"{row.speedup:.2f}x fewer steps"
                elif row.baseline_step == 0:
                    speedup = "– (the baseline's best is before training)"
                else:
                    speedup = "–"
                benchmark = "mean over benchmarks" if row.benchmark == S.MEAN else row.benchmark
                table.append(
                    [name, benchmark, f"{row.baseline_best:.3f} at step {row.baseline_step}", reached, speedup]
                )
            lines += _table(["run", "benchmark", "baseline best", "run reaches it", "speed-up"], table)
            lines += [
                "",
                "Speed-up = baseline's step of its best / the run's first step at or above it (the paper: 1.90x with",
                "one variant per question, 2.55x with three, against GRPO at an equal response budget).",
            ]
        else:
            lines.append("No benchmark is validated by both the baseline and another run.")
    if len(runs) > 1:
        lines += ["", "## Runs that coincide", ""]
        if coincident:
            lines += [
                "Series of these runs are equal value for value (same steps, values within a relative 1e-9); in",
                'the figures their panels have a red frame and say "same as <run>" (or "= <run>"). Identical curves',
                "usually mean the runs did the same thing (a method's change never applied, or the same seed and",
                "data given the same method twice).",
                "",
                *coincident_lines(coincident),
            ]
        else:
            lines.append("No series of two runs are equal value for value.")
    lines += ["", "## Figures", ""]
    for file, (title, skipped) in figures.items():
        lines += [f"### {title}", ""]
        lines += [f"_Skipped: {skipped}._" if skipped else f"![{title}]({file})", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in notes] + [""]
    return "\n".join(lines)


def summary_json(
    runs: list[Run], figures: dict[str, tuple[str, str | None]], coincident: list[dict] | None = None
) -> dict:
    return {
        "baseline": baseline(runs).name,
        "runs": [
            {"name": run.name, "path": str(run.path), "steps": sorted(run.log.steps), "notes": run.notes}
            for run in runs
        ],
        "summary": {
            label: dict(zip([r.name for r in runs], cells, strict=True)) for label, cells in summary_rows(runs)
        },
        "steps_to_baseline_best": [
            {
                "run": name,
                "benchmark": row.benchmark,
                "baseline_best": row.baseline_best,
                "baseline_step": row.baseline_step,
                "run_step": row.run_step,
                "run_best": row.run_best,
                "speedup": row.speedup,
            }
            for name, row in (steps_to_best_rows(runs) if len(runs) > 1 else [])
        ],
        "figures": {file: {"title": title, "skipped": skipped} for file, (title, skipped) in figures.items()},
        "coincident": list(coincident or []),
    }
