"""One method's training run in the lab: the tiny CPU run's settings for a task (:func:`run_overrides`) submitted as
its own Ray job through the launchers' ``run_scripts/_submit.sh`` (:func:`method_run`), as the comparison and the
sweep train every method.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from verl_ext.lab.rl_settings import RL_LR, ROLLOUT_TEMPERATURE
from verl_ext.lab.tasks import SWATCH_RESPONSE_LENGTH

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_overrides(
    method: str,
    paths: dict,
    run_dir: Path,
    experiment: str,
    *,
    steps: int,
    test_freq: int,
    seed: int,
    questions: int,
    rollout_n: int,
    without: tuple[str, ...] = (),
    val_samples: int | None = None,
) -> list[str]:
    """The Hydra overrides of ``method``'s run in the lab (:func:`method_run` says what each argument means)."""
    from verl_ext.cpu.overrides import cpu_overrides

    args = cpu_overrides(
        paths,
        str(run_dir / "checkpoints"),
        method=method,
        steps=steps,
        save_freq=test_freq,
        questions=questions,
        rollout_n=rollout_n,
        response_length=SWATCH_RESPONSE_LENGTH,
        experiment=experiment,
        ray_init=False,
        reward="paper",
        test_freq=test_freq,
        seed=seed,
        lr=RL_LR,
        without=without,
    )
    if val_samples is not None:
        # verl's sampling for the whole pass is the recipe's val_kwargs (0.6, 0.95); greedy rows say so themselves.
        args = [a for a in args if not a.startswith("actor_rollout_ref.rollout.val_kwargs.")]
        args += [
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
            f"actor_rollout_ref.rollout.val_kwargs.n={val_samples}",
        ]
    return [*args, f"actor_rollout_ref.rollout.temperature={ROLLOUT_TEMPERATURE}"]


def submit(args: list[str], run_dir: Path) -> float:
    """Run the job of ``args`` through ``run_scripts/_submit.sh`` (its log: ``run_dir/train.log``) with the CPU job's
    runtime env; returns its wall time in seconds, or raises with the log's end when it fails."""
    import yaml

    from verl_ext.cpu.runtime_env import runtime_env

    env_file = run_dir / "runtime_env.yaml"
    env_file.write_text(yaml.safe_dump(runtime_env(str(run_dir), str(REPO_ROOT)), sort_keys=False))
    env = {
        **os.environ,
        "CPU_E2E": "1",
        "DIVA_RUNTIME_ENV": str(env_file),
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "DIVA_LAUNCHER": "run_scripts/compare_tiny.sh",
    }
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.run(
            ["bash", str(REPO_ROOT / "run_scripts" / "_submit.sh"), *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"{run_dir.name}: training failed (exit {proc.returncode}); {run_dir / 'train.log'} ends:\n{tail}"
        )
    return seconds


def method_run(
    method: str,
    paths: dict,
    out: Path,
    *,
    steps: int,
    test_freq: int,
    seed: int,
    questions: int,
    rollout_n: int,
    run_dir: Path | None = None,
    without: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    val_samples: int | None = None,
) -> dict:
    """Train ``method`` into ``run_dir`` (default ``out/<method>``) with the launchers' submit script; returns its
    wall time. ``without``: DIVA-GRPO's additions removed (:mod:`verl_ext.cpu.ablations`); ``extra``: Hydra
    overrides appended (a released option); ``val_samples``: ``paths["val"]`` is a
    :func:`data_prep.validation_views` file, validated with the paper's sampling (temperature 0.6, top-p 0.95:
    the recipe's ``val_kwargs``) ``val_samples`` times per question beside its greedy copy; ``None``: greedy only."""
    # Absolute: the job runs in Ray's copy of the repository, where a relative metrics folder (the runtime env's
    # VERL_FILE_LOGGER_ROOT) would be written and lost (a relative OUT once left finished runs without metrics).
    out = Path(out).resolve()
    run_dir = Path(run_dir).resolve() if run_dir is not None else out / method
    run_dir.mkdir(parents=True, exist_ok=True)
    experiment = f"compare_{run_dir.relative_to(out).as_posix().replace('/', '_')}"
    settings = dict(steps=steps, test_freq=test_freq, seed=seed, questions=questions, rollout_n=rollout_n)
    args = run_overrides(method, paths, run_dir, experiment, **settings, without=without, val_samples=val_samples)
    return {"seconds": submit([*args, *extra], run_dir)}
