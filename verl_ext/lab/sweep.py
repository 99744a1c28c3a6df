"""DIVA-GRPO's additions and every method over seeds, on the swatch task: ``run_scripts/sweep_tiny.sh`` runs this.

One warm start and one task (:func:`verl_ext.lab.tasks.prepare_swatch`, seed 0: the same model, training and
validation questions for every run); each configuration of :data:`CONFIGS` trains from it once per seed, the seed
setting the data order, the variant draws and every rollout sample (:mod:`verl_ext.rollout.seeds`): at one seed all
configurations get the same per-request random draws, so a configuration's difference from GRPO at the same seed
(paired) is far less noisy than either run. Validation (:mod:`data_prep.validation_views`): each held-out question
greedily and ``val_samples`` times with the paper's sampling (temperature 0.6, top-p 0.95), before training and
every ``test_freq`` steps.

Runs go to ``OUT/<config>/seed<k>/``; a run that finished has ``OUT/<config>/seed<k>/done.json`` and is not run
again, so an interrupted sweep resumes where it stopped (a run cut short is started afresh). ``OUT/sweep.json``
holds the table (:func:`summarise`; ``OUT/sweep.md`` as Markdown), ``OUT/sweep_sampled.png`` and
``OUT/sweep_greedy.png`` the curves (mean and min-max band over seeds, one panel per configuration, GRPO in grey in
each); the last line printed is the table's JSON.

Per configuration, over the seeds that finished: best and final validation accuracy (sampled and greedy), the
steps to GRPO's best at the same seed (sampled validation), the mean zero-advantage fraction, the responses trained
on, and the paired difference from GRPO (same seed) of the best and final sampled accuracy; each as mean, min and
max over seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from verl_ext.lab.sweep_configs import BASELINE, CONFIGS, VAL_SAMPLES
from verl_ext.lab.sweep_runs import check_protocol, run_config, run_dir, run_protocol, warm_start_fingerprint
from verl_ext.lab.sweep_table import figures, summarise, table_lines, table_markdown
from verl_ext.lab.tasks import QUESTIONS_PER_STEP, TASKS, prepare_task


def sweep(
    out: Path,
    configs: list[str],
    seeds: list[int],
    *,
    steps: int,
    test_freq: int,
    questions: int = QUESTIONS_PER_STEP,
    rollout_n: int = 4,
    workdir: Path | None = None,
    task: str = "swatch",
) -> dict:
    """Run every configuration at every seed (skipping finished runs), then draw the figures; returns the summary
    (:func:`main` writes its table to ``OUT/sweep.json`` and ``OUT/sweep.md``). ``task``: :data:`TASKS`."""
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"CONFIGS: unknown {unknown}; known: {list(CONFIGS)}")
    if BASELINE not in configs:
        raise ValueError(f"CONFIGS must include {BASELINE!r}: every difference is paired with it by seed")
    out.mkdir(parents=True, exist_ok=True)
    paths = prepare_task(task, str(workdir or out / "work"), seed=0)
    if "properties" in paths:
        from verl_ext.lab.tasks import announce_task

        announce_task(task, paths, "sweep")
    views = Path(paths["val"]).with_name(Path(paths["val"]).stem + f"_views{VAL_SAMPLES}.parquet")
    if not views.exists():
        from data_prep.validation_views import validation_views

        validation_views(paths["val"], views, VAL_SAMPLES)
    paths = {**paths, "questions": paths["val"], "val": str(views)}
    protocol = run_protocol(
        steps=steps,
        test_freq=test_freq,
        questions=questions,
        rollout_n=rollout_n,
        warm_start=warm_start_fingerprint(paths["model"]),
        task=task,
    )
    check_protocol(out, configs, seeds, protocol)
    total, started = len(configs) * len(seeds), time.perf_counter()
    for i, (config, seed) in enumerate((c, s) for c in configs for s in seeds):
        finished = (run_dir(out, config, seed) / "done.json").exists()
        print(f"[sweep] {i + 1}/{total} {config} seed {seed}" + (" (done before)" if finished else ""), flush=True)
        record = run_config(out, config, seed, paths, protocol=protocol)
        if not finished:
            elapsed = (time.perf_counter() - started) / 60
            print(f"[sweep]   {record['minutes']} min; {elapsed:.1f} min since the sweep started", flush=True)
    summary = summarise(out, configs, seeds)
    summary["settings"] = {
        **protocol,
        "responses_per_question": 2 * rollout_n,
        "seeds": seeds,
        "warm_start_val_accuracy": paths["warm_start"]["val_accuracy"],
    }
    if "properties" in paths:
        summary["properties"] = {k: v for k, v in paths["properties"].items() if isinstance(v, dict)}
    summary["figures"] = figures(out, summary, task)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder (runs, sweep.json, figures)")
    parser.add_argument(
        "--configs", default=" ".join(CONFIGS), help="configurations (verl_ext.lab.sweep_configs.CONFIGS)"
    )
    parser.add_argument("--seeds", default="0 1 2", help="seeds, space-separated")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--test-freq", type=int, default=4, help="validate every this many steps (and before)")
    parser.add_argument("--rollout-n", type=int, default=4, help="responses per DIVA prompt (others: twice as many)")
    parser.add_argument("--workdir", type=Path, default=None, help="tiny model, data and warm start (default OUT/work)")
    parser.add_argument("--summary-only", action="store_true", help="tabulate the finished runs; train nothing")
    parser.add_argument("--task", default="swatch", choices=TASKS, help="swatch (default) or sparse")
    args = parser.parse_args(argv)
    configs, seeds = args.configs.split(), [int(s) for s in args.seeds.split()]
    if args.summary_only:
        summary = summarise(args.out, configs, seeds)
        summary["figures"] = figures(args.out, summary, args.task)
    else:
        summary = sweep(
            args.out,
            configs,
            seeds,
            steps=args.steps,
            test_freq=args.test_freq,
            rollout_n=args.rollout_n,
            workdir=args.workdir,
            task=args.task,
        )
    for line in table_lines(summary["table"]):
        print(line)
    table_json = {key: value for key, value in summary.items() if key != "figures"}  # the figures are beside it
    (args.out / "sweep.json").write_text(json.dumps(table_json, indent=1))
    (args.out / "sweep.md").write_text("\n".join(table_markdown(summary["table"])) + "\n")
    print(json.dumps(summary["table"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
