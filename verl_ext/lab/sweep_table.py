"""The seed sweep's table and figures, from the finished runs: each run's figures (:func:`run_figures`), per
configuration their mean, min and max over seeds and the paired difference from GRPO (:func:`summarise`), the table as
text and Markdown (:func:`table_lines`, :func:`table_markdown`) and the curves (:func:`figures`).
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_ext.lab.sweep_configs import BASELINE, CONFIGS, VAL_SAMPLES
from verl_ext.lab.sweep_runs import SIGNAL_FILE, run_dir
from verl_ext.lab.tasks import QUESTIONS_PER_STEP


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    # Unrounded: the tables round once, when they print (rounding here too turned 0.64453125 into 0.6445, then 0.644).
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "n": len(values)}


def run_figures(folder: Path) -> dict:
    """One run's figures: validation curves (sampled and greedy), zero-advantage fraction, responses trained on."""
    from verl_ext.methods import get_method
    from verl_ext.report.run import load_run
    from verl_ext.report.series import series, validation_series

    done = json.loads((folder / "done.json").read_text())
    spec = CONFIGS[done["config"]]
    log = load_run(folder).log
    curves = {}
    for source, (steps, values) in validation_series(log).items():
        for view in ("greedy", "sampled"):
            if source.endswith(f"_{view}"):
                curves[view] = ([int(s) for s in steps], [float(v) for v in values])
    missing = {"greedy", "sampled"} - set(curves)
    if missing:
        raise ValueError(f"{folder}: no {sorted(missing)} validation in its metrics (is the validation file a view?)")
    prefix = get_method(spec.method).prefix
    _, zero = series(log, f"{prefix}/advantage/zero_fraction")
    trained = [s for s, values in log.steps.items() if "actor/pg_loss" in values]
    figures = {}
    signal = folder / SIGNAL_FILE  # the sparse task: the originals' own zero-advantage fraction (DIVA: half)
    if signal.exists():
        figures["original_zero_advantage_fraction"] = 1 - json.loads(signal.read_text())["original_signal"]
    questions = folder / "questions.json"  # the sparse task: unsolved questions the final policy solves
    if questions.exists():
        record = json.loads(questions.read_text())
        figures["unsolved_solved_share"] = record["solved_share"]
        moved = record.get("unsolved_right_log_prob")
        if moved and moved.get("start") is not None:  # how far the run moved the questions it could not solve
            figures["unsolved_log_prob_change"] = moved["end"] - moved["start"]
    return {
        **figures,
        "curves": curves,
        "zero_advantage_fraction": float(sum(zero) / len(zero)) if len(zero) else None,
        "steps": len(trained),
        "responses": len(trained) * QUESTIONS_PER_STEP * done["responses_per_question"],
        "minutes": done["minutes"],
    }


def _first_reaching(curve: tuple[list[int], list[float]], target: float) -> int | None:
    for step, value in zip(*curve, strict=True):
        if value >= target - 1e-9:
            return step
    return None


def summarise(out: Path, configs: list[str], seeds: list[int]) -> dict:
    """The sweep's table from the finished runs under ``out`` (module docstring)."""
    finished = [(c, s) for c in configs for s in seeds if (run_dir(out, c, s) / "done.json").exists()]
    protocols: dict[str, list[str]] = {}
    for c, s in finished:
        protocol = json.loads((run_dir(out, c, s) / "done.json").read_text()).get("protocol")
        protocols.setdefault(json.dumps(protocol, sort_keys=True), []).append(f"{c}/seed{s}")
    if len(protocols) > 1:
        groups = "; ".join(f"{', '.join(names)}: {protocol}" for protocol, names in protocols.items())
        raise ValueError(f"{out}: runs of different protocols cannot be paired or pooled: {groups}")
    runs = {c: {s: run_figures(run_dir(out, c, s)) for cc, s in finished if cc == c} for c in configs}
    base = runs.get(BASELINE, {})
    table = {}
    for config, by_seed in runs.items():
        if not by_seed:
            continue
        row: dict = {"seeds": sorted(by_seed), "note": CONFIGS[config].note}
        for view in ("sampled", "greedy"):
            row[f"best_{view}"] = _stats([max(f["curves"][view][1]) for f in by_seed.values()])
            row[f"final_{view}"] = _stats([f["curves"][view][1][-1] for f in by_seed.values()])
        row["zero_advantage_fraction"] = _stats([f["zero_advantage_fraction"] for f in by_seed.values()])
        for key in SPARSE_COLUMNS:
            if any(key in f for f in by_seed.values()):
                row[key] = _stats([f.get(key) for f in by_seed.values()])
        row["responses"] = _stats([f["responses"] for f in by_seed.values()])
        row["minutes"] = _stats([f["minutes"] for f in by_seed.values()])
        paired = [s for s in by_seed if s in base]
        if paired:
            steps_to = []
            for s in paired:
                reached = _first_reaching(by_seed[s]["curves"]["sampled"], max(base[s]["curves"]["sampled"][1]))
                steps_to.append(reached)
            row["steps_to_grpo_best"] = {
                "per_seed": dict(zip(map(str, paired), steps_to, strict=True)),
                "reached": sum(x is not None for x in steps_to),
            }
            for what, pick in (("best", max), ("final", lambda v: v[-1])):
                diffs = [
                    pick(by_seed[s]["curves"]["sampled"][1]) - pick(base[s]["curves"]["sampled"][1]) for s in paired
                ]
                row[f"{what}_sampled_minus_grpo"] = _stats(diffs)
        table[config] = row
    return {"runs": runs, "table": table}


def figures(out: Path, summary: dict, task: str = "swatch") -> list[str]:
    """The sweep's curves (sampled and greedy validation) as PNGs in ``out``; returns their paths."""
    import matplotlib.pyplot as plt

    from verl_ext.report.sweep_figures import sweep_figure

    written = []
    for view in ("sampled", "greedy"):
        curves = {
            config: {int(seed): tuple(f["curves"][view]) for seed, f in by_seed.items()}
            for config, by_seed in summary["runs"].items()
            if by_seed
        }
        if not curves:
            continue
        how = f"mean of {VAL_SAMPLES} samples, T=0.6" if view == "sampled" else "greedy"
        label = f"validation accuracy ({how})"
        figure, _ = sweep_figure(curves, BASELINE, f"{task} task, {view} validation, mean and range over seeds", label)
        path = out / f"sweep_{view}.png"
        figure.savefig(path, bbox_inches="tight")
        plt.close(figure)
        written.append(str(path))
    return written


def _fmt(stats: dict | None, digits: int = 3) -> str:
    if stats is None:
        return "-"
    if stats["n"] == 1:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} [{stats['min']:.{digits}f}, {stats['max']:.{digits}f}]"


def table_lines(table: dict) -> list[str]:
    """The table as text: one line per configuration, mean [min, max] over seeds."""
    head = (
        f"{'configuration':<30} {'seeds':>5} {'best (sampled)':>22} {'final (sampled)':>22} {'best (greedy)':>22} "
        f"{'best - GRPO (paired)':>24} {'zero-adv':>8} {'to GRPO best':>12}"
    )
    lines = [head]
    for config, row in table.items():
        reached = row.get("steps_to_grpo_best")
        steps_to = "-"
        if reached:
            got = [v for v in reached["per_seed"].values() if v is not None]
            steps_to = f"{reached['reached']}/{len(reached['per_seed'])}" + (
                f" ~{sum(got) / len(got):.0f}" if got else ""
            )
        zero = row["zero_advantage_fraction"]
        lines.append(
            f"{config:<30} {len(row['seeds']):>5} {_fmt(row['best_sampled']):>22} {_fmt(row['final_sampled']):>22} "
            f"{_fmt(row['best_greedy']):>22} {_fmt(row.get('best_sampled_minus_grpo')):>24} "
            f"{(zero['mean'] if zero else float('nan')):>8.3f} {steps_to:>12}"
        )
    return lines


def table_markdown(table: dict) -> list[str]:
    """The table as Markdown (``OUT/sweep.md``, for the README): sampled validation, mean [min, max] over seeds;
    the seeds at which a configuration reached GRPO's best (and the steps it took); the responses trained on."""
    # The sparse task's columns (verl_ext.lab.sparse_task), where the runs have them.
    sparse = [k for k in SPARSE_COLUMNS if any(k in row for row in table.values())]
    lines = [
        "| configuration | seeds | best (sampled) | final (sampled) | best (greedy) | best - GRPO, paired | "
        "reaches GRPO's best: seeds, at step | zero-advantage fraction | "
        + "".join(f"{SPARSE_COLUMNS[k]} | " for k in sparse)
        + "responses |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(sparse) + "---|",
    ]
    for config, row in table.items():
        zero = row["zero_advantage_fraction"]
        zero_text = f"{zero['mean']:.3f}" if zero else "-"
        seeds = ", ".join(map(str, row["seeds"]))
        lines.append(
            f"| `{config}` | {seeds} | {_fmt(row['best_sampled'])} | {_fmt(row['final_sampled'])} | "
            f"{_fmt(row['best_greedy'])} | {_fmt(row.get('best_sampled_minus_grpo'))} | "
            f"{_reached_text(row.get('steps_to_grpo_best'))} | {zero_text} | "
            + "".join(f"{_fmt(row.get(k), 2)} | " for k in sparse)
            + f"{_count_text(row['responses'])} |"
        )
    return lines


SPARSE_COLUMNS = {
    "original_zero_advantage_fraction": "originals' zero-advantage fraction",
    "unsolved_solved_share": "unsolved at the start, solved at the end",
    "unsolved_log_prob_change": "their right answer's log-probability, change",
}


def _count_text(stats: dict) -> str:
    """A count over seeds: the number when every seed has it, else mean [min, max]."""
    return f"{stats['mean']:.0f}" if stats["min"] == stats["max"] else _fmt(stats, 0)


def _reached_text(reached: dict | None) -> str:
    """``2/3 at 8, 12``: at how many of the paired seeds the sampled validation reached GRPO's best, and at which
    steps (in seed order); ``-`` without a GRPO run to pair with."""
    if not reached:
        return "-"
    steps = [str(v) for v in reached["per_seed"].values() if v is not None]
    return f"{reached['reached']}/{len(reached['per_seed'])}" + (f" at {', '.join(steps)}" if steps else "")
