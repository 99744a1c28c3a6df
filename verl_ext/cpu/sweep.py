"""DIVA-GRPO's additions and every method over seeds, on the swatch task: ``run_scripts/sweep_tiny.sh`` runs this.

One warm start and one task (:func:`verl_ext.cpu.compare.prepare_swatch`, seed 0: the same model, training and
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
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_ext.cpu.compare import QUESTIONS_PER_STEP, TASKS, method_run, prepare_task, task_overrides

VAL_SAMPLES = 4  # the paper's "mean over k samples per question", k small enough for two CPU cores


@dataclass(frozen=True)
class SweepConfig:
    """One configuration: the method, DIVA-GRPO's additions removed, extra overrides, and the responses per question
    as a multiple of the comparison's ``2 n``."""

    method: str
    without: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    budget: int = 1
    note: str = ""
    tags: tuple[str, ...] = field(default=())


_RC = "algorithm.rollout_correction"  # verl 0.9.1's rollout correction (verl/trainer/ppo/rollout_corr_helper.py)

# In the order they run (each for every seed before the next), most informative first: GRPO, DIVA-GRPO with the
# paper's defaults, DIVA-GRPO without each addition, GRPO with twice the responses (the slowest run), the authors'
# released options, the toolkit's methods.
CONFIGS: dict[str, SweepConfig] = {
    "grpo": SweepConfig("grpo", note="verl's GRPO, 2n responses per question (the baseline)"),
    "diva_grpo": SweepConfig("diva_grpo", note="DIVA-GRPO, the paper's defaults"),
    "diva_no_variants": SweepConfig("diva_grpo", without=("variants",), note="no variants: 2n on the original"),
    "diva_no_global_stream": SweepConfig("diva_grpo", without=("global_stream",), note="global_coef=0"),
    "diva_no_difficulty_weighting": SweepConfig("diva_grpo", without=("difficulty_weighting",), note="k=0"),
    "diva_no_batch_norm": SweepConfig("diva_grpo", without=("batch_norm",), note="batch_norm=false"),
    "diva_no_rrb": SweepConfig("diva_grpo", without=("rrb",), note="rrb=false"),
    "grpo_2x": SweepConfig("grpo", budget=2, note="verl's GRPO with twice the responses per question (4n)"),
    "diva_binned_rule": SweepConfig(
        "diva_grpo",
        extra=("diva.difficulty.rule=binned", "diva.difficulty.alpha_source=reward"),
        note="the released difficulty update: five bins of the mean reward",
    ),
    "diva_released_planner": SweepConfig(
        "diva_grpo", extra=("diva.variants.planner=released",), note="the released variant planner"
    ),
    "avspo": SweepConfig("avspo"),
    "codapo": SweepConfig("codapo"),
    "durian": SweepConfig("durian"),
    "pgpo": SweepConfig("pgpo"),
    "mupo": SweepConfig("mupo"),
    "noise_contrastive_grpo": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=2.0", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=2, no rollout correction (noisy half trained as the clean policy's own samples)",
    ),
    # NC-GRPO's scale and verl's rollout correction (issue 44), each pinned here so that a configuration keeps its
    # meaning when the method's defaults change. The correction weighs each token by old_log_probs (the clean
    # actor) against rollout_log_probs (the policy that sampled it: the displaced one for the noisy half, hf_cpu and
    # vLLM alike), truncated at 2; the clean half's weights are 1 up to weight-sync rounding.
    "nc_grpo_rc": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=2.0",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=2, verl's sequence-level truncated IS (min(prod pi_old/pi_rollout, 2))",
    ),
    "nc_grpo_rc_token": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=2.0", f"{_RC}.rollout_is=token", f"{_RC}.rollout_is_threshold=2.0"),
        note="NC-GRPO, c=2, verl's token-level truncated IS (min(pi_old/pi_rollout, 2) per token)",
    ),
    "nc_grpo_c1": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=1.0", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=1, no rollout correction",
    ),
    "nc_grpo_c05": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=0.5", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=0.5, no rollout correction",
    ),
    "nc_grpo_rc_c1": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=1.0",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=1, verl's sequence-level truncated IS",
    ),
    "nc_grpo_rc_c05": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=0.5",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=0.5, verl's sequence-level truncated IS",
    ),
}
BASELINE = "grpo"


def run_dir(out: Path, config: str, seed: int) -> Path:
    return out / config / f"seed{seed}"


def warm_start_fingerprint(model_dir: str) -> str:
    """The first 16 hex digits of the warm start's weights' SHA-256: runs are paired only from the same start."""
    digest = hashlib.sha256()
    with open(Path(model_dir) / "model.safetensors", "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_protocol(
    *, steps: int, test_freq: int, questions: int, rollout_n: int, warm_start: str, task: str = "swatch"
) -> dict:
    """What a run's figures depend on beside its configuration and seed; kept in its ``done.json``. (The swatch
    task's protocol has no ``task`` key: its recorded runs were written before there was another task.)"""
    protocol = {
        "steps": steps,
        "test_freq": test_freq,
        "questions_per_step": questions,
        "rollout_n": rollout_n,
        "val_samples": VAL_SAMPLES,
        "warm_start": warm_start,
    }
    return protocol if task == "swatch" else {**protocol, "task": task}


def machine_kind() -> dict:
    """What a run's floats depend on beyond its code and seed: the CPU, the kernels torch picks for it, the threads and
    the libraries. Kept in each run's ``done.json`` (not in its protocol: the warm start's fingerprint is what pairs
    runs, and it changes with these)."""
    import platform

    import torch
    import transformers

    cpu, flags = platform.processor() or platform.machine(), set()
    kernel_relevant = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:  # not Linux: the model name from platform, no flags
        pass
    return {
        "cpu": cpu,
        "cpu_extensions": sorted(flags & kernel_relevant),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _protocol_difference(got: dict | None, want: dict) -> str:
    if got is None:
        return "no protocol recorded (an older sweep's run)"
    return ", ".join(f"{k} {got.get(k)!r} (here {v!r})" for k, v in want.items() if got.get(k) != v)


def _another_protocol(folder: Path, record: dict, protocol: dict) -> ValueError:
    message = (
        f"{folder} finished under another protocol: {_protocol_difference(record.get('protocol'), protocol)}."
        " Its figures cannot be paired with this sweep's: use another OUT, or this run's settings"
    )
    if (record.get("protocol") or {}).get("warm_start") not in (None, protocol["warm_start"]):
        # Same code and seed, other weights: float kernels sum in another order on another CPU or library version,
        # and 300 steps of training carry the difference into every sample (docs/learning.md, "Which runs pair").
        recorded = record.get("machine")
        message += (
            ". The warm start is rebuilt from the same code and seed, so its weights differ with the CPU kind or the"
            f" libraries: recorded on {recorded if recorded else 'a machine its done.json does not name'}, here"
            f" {machine_kind()}. Finish this sweep on the machine kind that recorded it, or start another OUT"
        )
    return ValueError(message)


def _finished(folder: Path, protocol: dict) -> dict | None:
    """The run's ``done.json`` if it finished (under ``protocol``: another one is an error), else ``None``."""
    done = folder / "done.json"
    if not done.exists():
        return None
    record = json.loads(done.read_text())
    if record.get("protocol") != protocol:
        raise _another_protocol(folder, record, protocol)
    return record


def check_protocol(out: Path, configs: list[str], seeds: list[int], protocol: dict) -> None:
    """Refuse, before anything trains, a sweep whose finished runs under ``out`` ran under another protocol."""
    for config in configs:
        for seed in seeds:
            _finished(run_dir(out, config, seed), protocol)


def run_config(out: Path, config: str, seed: int, paths: dict, *, protocol: dict) -> dict:
    """Train ``config`` at ``seed`` under ``protocol`` (:func:`run_protocol`) unless it finished before under the
    same protocol; returns its ``done.json``. A run finished under another protocol is an error, not reused.
    The sparse task's runs also measure, from their final weights, the questions they solve
    (:func:`verl_ext.cpu.sparse_task.solved_record`)."""
    task = protocol.get("task", "swatch")
    folder = run_dir(out, config, seed)
    record = _finished(folder, protocol)
    if record is not None:
        return record
    if folder.exists():  # cut short: its metrics would mix two attempts
        shutil.rmtree(folder)
    spec = CONFIGS[config]
    timing = method_run(
        spec.method,
        paths,
        out,
        steps=protocol["steps"],
        test_freq=protocol["test_freq"],
        seed=seed,
        questions=protocol["questions_per_step"],
        rollout_n=protocol["rollout_n"] * spec.budget,
        run_dir=folder,
        without=spec.without,
        extra=(*spec.extra, *task_overrides(task)),
        val_samples=VAL_SAMPLES,
    )
    if task == "sparse":  # before the checkpoints go: which unsolved questions the final policy solves
        from verl_ext.cpu.learning_signal import run_means, signal_figures
        from verl_ext.cpu.sparse_task import solved_record

        solved_record(folder, paths["model"], paths["questions"], paths["properties"], seed=0)
        (folder / SIGNAL_FILE).write_text(json.dumps(run_means(signal_figures(str(folder)))))
    record = {
        "config": config,
        "seed": seed,
        "minutes": round(timing["seconds"] / 60, 2),
        "responses_per_question": 2 * protocol["rollout_n"] * spec.budget,
        "protocol": protocol,
        "machine": machine_kind(),
    }
    # Checkpoints are not needed once the run finished (a few hundred MB each run, 16 x 3 runs).
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    (folder / "done.json").write_text(json.dumps(record))
    return record


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


# The sparse task's runs keep their learning-signal means (verl_ext.cpu.learning_signal.run_means) here, written when
# the run finishes from its probe records (which the recorded runs do not keep); a swatch run's table reads none.
SIGNAL_FILE = "signal.json"


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
    # The sparse task's columns (verl_ext.cpu.sparse_task), where the runs have them.
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
        from verl_ext.cpu.compare import announce_task

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
    parser.add_argument("--configs", default=" ".join(CONFIGS), help="configurations (verl_ext.cpu.sweep.CONFIGS)")
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
