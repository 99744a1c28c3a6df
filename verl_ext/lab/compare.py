"""Every method side by side on a task the tiny CPU model can learn: ``run_scripts/compare_tiny.sh`` runs this.

From one warm start (:func:`verl_ext.lab.tasks.prepare_swatch`: the tiny Qwen2-VL supervised into a base policy that
half-solves ``diva-prep swatch`` questions, its greedy validation accuracy checked to be in 20-60%; or, ``--task
sparse``, :func:`verl_ext.lab.sparse_task.prepare_sparse`: hard questions with solvable hints, its properties
printed), each method trains for the same number of steps, with the same seed, data and responses per question
(``2 n``: DIVA as original + 1 variant x ``n``, the others as 1 prompt x ``2 n``), each as its own Ray job through
the launchers' ``run_scripts/_submit.sh`` (verl's trainer, FSDP2 worker, ``hf_cpu`` rollout, the project's reward
:func:`verl_ext.reward.compute_score`), validating before training and every ``test_freq`` steps (greedy). Then
``diva-report`` over all runs (GRPO first: the baseline) into ``OUT/report/``, and ``OUT/comparison.json``::

    {"warm_start": {"val_accuracy": a},
     "methods": {"<adv_estimator>": {"val_accuracy": [[step, acc], ...],
                                     "zero_advantage_fraction": [[step, f], ...], "steps": n,
                                     "minutes": m,
                                     # diva_grpo only:
                                     "difficulty_mean": [[step, d], ...],
                                     "accuracy_by_variant": {"<kind>": acc, ...},
                                     "accuracy_gap_by_variant": {"<kind>": gap, ...},
                                     "difficulty_of_solved": d1, "difficulty_of_failed": d2}},
     "claims": {...},
     # TASK=sparse only: the warm start's three properties (verl_ext.lab.sparse_task.task_properties), and per
     # method "unsolved_solved_share": the warm start's unsolved validation questions its final policy solves
     "properties": {...}}

``zero_advantage_fraction`` is ``<prefix>/advantage/zero_fraction`` (every method logs it): the step's responses
whose advantage is 0 on every token. ``accuracy_by_variant`` is the training accuracy of each variant kind over the
run (weighted by responses); ``accuracy_gap_by_variant`` the mean, over questions, of variant minus original
accuracy in the same step (:func:`verl_ext.methods.diva.variant_accuracy_metrics`). ``claims`` checks what the
issue asks the comparison to show (:func:`claims`); a claim that fails is reported as failed, never hidden.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from verl_ext.lab.runs import REPO_ROOT, method_run
from verl_ext.lab.tasks import QUESTIONS_PER_STEP, TASKS, announce_task, prepare_task, task_overrides

ALL_METHODS = ("grpo", "diva_grpo", "avspo", "codapo", "durian", "pgpo", "mupo", "noise_contrastive_grpo")
QUICK_METHODS = ("grpo", "diva_grpo")


def _pairs(log, key: str) -> list[list]:
    from verl_ext.report.series import series

    steps, values = series(log, key)
    return [[int(s), round(float(v), 6)] for s, v in zip(steps, values, strict=True)]


def method_entry(method: str, run_dir: Path) -> dict:
    """The comparison entry of one method, from its run folder's merged metrics log."""
    from verl_ext.methods import get_method
    from verl_ext.report.run import load_run
    from verl_ext.report.series import validation_series

    log = load_run(run_dir).log
    found = validation_series(log)
    if len(found) != 1:
        raise ValueError(f"{run_dir}: expected one validation benchmark in the metrics, found {sorted(found)}")
    (val_steps, val_values) = next(iter(found.values()))
    prefix = get_method(method).prefix
    zero_key = f"{prefix}/advantage/zero_fraction"
    trained = [s for s, values in log.steps.items() if "actor/pg_loss" in values]
    entry = {
        "val_accuracy": [[int(s), round(float(v), 6)] for s, v in zip(val_steps, val_values, strict=True)],
        "zero_advantage_fraction": _pairs(log, zero_key),
        "steps": len(trained),
    }
    if not entry["zero_advantage_fraction"]:
        raise ValueError(f"{run_dir}: {method} logged no {zero_key}")
    if method == "diva_grpo":
        entry["difficulty_mean"] = _pairs(log, "diva/difficulty/mean")
        entry.update(_variant_figures(log))
    return entry


def _variant_figures(log) -> dict:
    accuracy, responses, gaps = {}, {}, {}
    solved, failed = [], []
    for values in log.steps.values():
        for key, value in values.items():
            if key.startswith("diva/accuracy/") and not key.endswith("/responses"):
                kind = key[len("diva/accuracy/") :]
                count = values.get(f"{key}/responses", 0.0)
                accuracy[kind] = accuracy.get(kind, 0.0) + value * count
                responses[kind] = responses.get(kind, 0.0) + count
            elif key.startswith("diva/accuracy_gap/"):
                gaps.setdefault(key[len("diva/accuracy_gap/") :], []).append(value)
        if "diva/difficulty/solved_mean" in values:
            solved.append(values["diva/difficulty/solved_mean"])
        if "diva/difficulty/failed_mean" in values:
            failed.append(values["diva/difficulty/failed_mean"])
    mean = lambda xs: round(sum(xs) / len(xs), 6) if xs else None  # noqa: E731
    return {
        "accuracy_by_variant": {k: round(accuracy[k] / responses[k], 6) for k in sorted(accuracy) if responses[k]},
        "responses_by_variant": {k: int(responses[k]) for k in sorted(responses) if responses[k]},
        "accuracy_gap_by_variant": {k: mean(v) for k, v in sorted(gaps.items())},
        "difficulty_of_solved": mean(solved),
        "difficulty_of_failed": mean(failed),
    }


def _mean_second(pairs: list[list]) -> float | None:
    return sum(v for _, v in pairs) / len(pairs) if pairs else None


def claims(comparison: dict, margin: float = 0.10) -> dict:
    """What the comparison must show (the issue's four claims), each ``{"held": bool, ...measured}``."""
    warm = comparison["warm_start"]["val_accuracy"]
    methods = comparison["methods"]
    out: dict = {}
    best = {m: max(v for _, v in e["val_accuracy"]) for m, e in methods.items()}
    out["best_at_least_10_points_above_warm_start"] = {
        "held": all(b >= warm + margin - 1e-9 for b in best.values()),
        "warm_start": warm,
        "best": best,
    }
    if "grpo" in methods and "diva_grpo" in methods:
        grpo = _mean_second(methods["grpo"]["zero_advantage_fraction"])
        diva = _mean_second(methods["diva_grpo"]["zero_advantage_fraction"])
        out["diva_zero_advantage_below_grpo"] = {"held": diva < grpo, "diva_grpo": diva, "grpo": grpo}
    diva_entry = methods.get("diva_grpo")
    if diva_entry:
        acc, gap = diva_entry["accuracy_by_variant"], diva_entry["accuracy_gap_by_variant"]
        perturb, hint = gap.get("image_perturb"), gap.get("hint")
        out["image_perturb_harder_hint_easier"] = {
            "held": perturb is not None and hint is not None and perturb < 0 < hint,
            "accuracy_by_variant": acc,
            "accuracy_gap_by_variant": gap,
        }
        solved, failed = diva_entry["difficulty_of_solved"], diva_entry["difficulty_of_failed"]
        out["difficulty_moves_with_accuracy"] = {
            "held": solved is not None and failed is not None and solved < failed,
            "difficulty_of_solved": solved,
            "difficulty_of_failed": failed,
        }
    return out


def _trained_entry(method: str, paths: dict, out: Path, task: str, run: dict) -> dict:
    """Train ``method`` (``run``: steps, test_freq, seed, questions, rollout_n) and return its comparison entry."""
    print(f"[compare] {method}: training {run['steps']} steps", flush=True)
    timing = method_run(method, paths, out, **run, extra=task_overrides(task))
    entry = method_entry(method, out / method)
    entry["minutes"] = round(timing["seconds"] / 60, 2)
    if task == "sparse":  # the warm start's unsolved validation questions that the final policy solves
        from verl_ext.lab.solved_questions import solved_record

        record = solved_record(out / method, paths["model"], paths["val"], paths["properties"], seed=0)
        entry["unsolved_solved_share"] = record["solved_share"]
    print(f"[compare] {method}: validation {entry['val_accuracy']} ({entry['minutes']} min)", flush=True)
    return entry


def _write_report(out: Path, methods: list[str]) -> None:
    """``diva-report`` over every method's run (the first is the baseline) into ``out/report``."""
    runs = [str(out / m) for m in methods]
    report = [sys.executable, "-m", "verl_ext.report", *runs, "--output", str(out / "report")]
    subprocess.run(report, check=True, cwd=REPO_ROOT)


def compare(
    out: Path,
    methods: list[str],
    *,
    steps: int,
    test_freq: int,
    seed: int = 0,
    questions: int = QUESTIONS_PER_STEP,
    rollout_n: int = 4,
    workdir: Path | None = None,
    task: str = "swatch",
) -> dict:
    """Warm start, train every method, write ``comparison.json`` and the report; returns the comparison.
    ``task``: :data:`TASKS` (the sparse task's properties go into ``comparison.json`` too)."""
    from verl_ext.methods import METHODS

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"METHODS: unknown {unknown}; the toolkit's adv_estimator names are {sorted(METHODS)}")
    if steps < 1 or test_freq < 1:
        raise ValueError(f"steps={steps} and test_freq={test_freq} must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    paths = prepare_task(task, str(workdir or out / "work"), seed=seed)
    announce_task(task, paths, "compare")
    comparison: dict = {
        "warm_start": {"val_accuracy": paths["warm_start"]["val_accuracy"], "steps": paths["warm_start"]["steps"]},
        "settings": {
            "task": task,
            "steps": steps,
            "test_freq": test_freq,
            "seed": seed,
            "questions_per_step": questions,
            "responses_per_question": 2 * rollout_n,
            "methods": methods,
        },
        "methods": {},
    }
    if "properties" in paths:
        comparison["properties"] = paths["properties"]
    run = dict(steps=steps, test_freq=test_freq, seed=seed, questions=questions, rollout_n=rollout_n)
    for method in methods:
        comparison["methods"][method] = _trained_entry(method, paths, out, task, run)
    comparison["claims"] = claims(comparison)
    comparison["minutes"] = round((time.perf_counter() - started) / 60, 2)
    (out / "comparison.json").write_text(json.dumps(comparison, indent=1))
    _write_report(out, methods)
    return comparison


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder (runs, report/, comparison.json)")
    parser.add_argument("--methods", default=" ".join(ALL_METHODS), help="adv_estimator names, space-separated")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--test-freq", type=int, default=2, help="validate every this many steps (and before)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=int, default=QUESTIONS_PER_STEP, help="questions per step")
    parser.add_argument("--rollout-n", type=int, default=4, help="responses per DIVA prompt (others: twice as many)")
    parser.add_argument("--workdir", type=Path, default=None, help="tiny model, data and warm start (default OUT/work)")
    parser.add_argument("--task", default="swatch", choices=TASKS, help="swatch (default) or sparse")
    args = parser.parse_args(argv)
    methods = args.methods.split()
    result = compare(
        args.out,
        methods,
        steps=args.steps,
        test_freq=args.test_freq,
        seed=args.seed,
        questions=args.questions,
        rollout_n=args.rollout_n,
        workdir=args.workdir,
        task=args.task,
    )
    print(f"[compare] wrote {args.out / 'comparison.json'} and {args.out / 'report' / 'report.md'}")
    print(json.dumps({"claims": {k: v["held"] for k, v in result["claims"].items()}, "minutes": result["minutes"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
