"""A CPU training session: train, resume from the checkpoint for more steps, check and print a summary.

:func:`train_then_resume` is what ``run_scripts/tiny_cpu.sh`` runs (through the recipe's entry point, in one Ray
job): verl's own ``run_ppo`` twice in one driver, the second time with ``trainer.resume_mode=auto`` on the first
run's checkpoint folder, under another experiment name so that nothing of the first run (its difficulty service
actor above all) is found in memory: the resumed state can only come from the checkpoint. :func:`summarize` reads
what the runs wrote (verl's file-logger metrics, the checkpoint, :mod:`verl_ext.checks.probe` records) and checks
the facts a real run must show; :func:`format_summary` prints them like the preflight's summary.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from collections.abc import Callable
from copy import deepcopy

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_ext.checks.probe import PROBE_ENV

# The largest |mean rollout log-prob - mean actor log-prob| of a response (verl's rollout_corr/log_ppl_abs_diff)
# accepted as "the weights were synced". Float32 on both sides: ~1e-6 with the sync.
LOGPROB_TOLERANCE = 1e-4
RESUMED_SUFFIX = "_resumed"


class CpuRunError(RuntimeError):
    """A CPU run finished but does not show what a real training run must (the message says what)."""


def release_finished_run(timeout_s: float = 120.0) -> None:
    """Free what a finished run of this job left in the cluster before the next run starts.

    Its actors die with its task runner; they are waited for (the next run's rollout server takes the same name
    in this job's namespace). Its placement groups do not: Ray scopes them to the job, not to the actor that made
    them, so they would keep the one logical GPU. This job's groups (a Ray id ends with its job id) are removed.
    """
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    job = ray.get_runtime_context().get_job_id()
    for pg_id, info in ray.util.placement_group_table().items():
        if pg_id.endswith(job) and info["state"] != "REMOVED":
            ray.util.remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
    total_gpus = ray.cluster_resources().get("GPU", 0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        actors = ray.util.list_named_actors()
        if not actors and ray.available_resources().get("GPU", 0) >= total_gpus:
            return
        time.sleep(0.5)
    raise CpuRunError(f"the finished run still holds actors {sorted(actors)[:5]} or the GPU after {timeout_s}s")


def resumed_config(config: DictConfig, more_steps: int) -> DictConfig:
    """The config of the resumed run: ``more_steps`` more steps from the last checkpoint, another experiment name."""
    cfg = deepcopy(config)
    with open_dict(cfg):
        cfg.trainer.total_training_steps = int(config.trainer.total_training_steps) + more_steps
        cfg.trainer.experiment_name = f"{config.trainer.experiment_name}{RESUMED_SUFFIX}"
        cfg.trainer.resume_mode = "auto"
    return cfg


def train_then_resume(config: DictConfig, train: Callable[[DictConfig], None], resume_steps: int) -> dict:
    """Run ``train(config)``, then ``train`` on :func:`resumed_config`; returns :func:`summarize`'s summary."""
    started = time.perf_counter()
    steps = int(config.trainer.total_training_steps)
    if config.trainer.save_freq <= 0 or steps % config.trainer.save_freq:
        raise ValueError(
            f"trainer.save_freq={config.trainer.save_freq} saves no checkpoint at step {steps} (trainer."
            "total_training_steps) to resume from; use a divisor of it"
        )
    train(config)  # verl's run_ppo connects to Ray (the job's cluster, or a local one it starts)
    release_finished_run()
    train(resumed_config(config, resume_steps))
    summary = summarize(config, resume_steps)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    return summary


def _read_metrics(config: DictConfig, experiment: str) -> list[dict]:
    root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
    path = os.path.join(root, config.trainer.project_name, f"{experiment}.jsonl")
    if not os.path.exists(path):
        raise CpuRunError(f"no metrics at {path}: set VERL_FILE_LOGGER_ROOT and trainer.logger=[console,file]")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# A method whose rollout departs from the policy on some tokens on purpose (NC-GRPO's displaced tokens: every token
# of a noisy response, or its first under target=final_hidden) logs the rollout-vs-actor gap of the other tokens as
# <its metric prefix>/OWN_GAP_METRIC; verl's metric averages in all tokens.
OWN_GAP_METRIC = "rollout_logprob_gap/other_tokens"


def _checked(entry: dict, exact_check: bool = False, own_gap_key: str | None = None) -> dict:
    data, step = entry["data"], entry["step"]
    grad, loss = data.get("actor/grad_norm"), data.get("actor/pg_loss")
    if grad is None or not math.isfinite(grad) or grad == 0.0:
        raise CpuRunError(f"step {step}: actor/grad_norm={grad}; a real step has a finite, non-zero gradient")
    # One on-policy update of batch-normalised advantages: the token-mean loss is exactly 0 when every response
    # has the same length, and non-zero otherwise.
    lengths_vary = data.get("response_length/min") != data.get("response_length/max")
    if loss is None or not math.isfinite(loss) or (lengths_vary and loss == 0.0):
        raise CpuRunError(f"step {step}: actor/pg_loss={loss}; a real step has a finite loss, non-zero here")
    gap = data.get(own_gap_key, data.get("rollout_corr/log_ppl_abs_diff"))
    # verl's vLLM rollout normalises over the tokens its sampler allows: checked exactly by
    # verl_ext.checks.logprob_check (exact_check) instead of against this metric, which then also measures the
    # banned tokens' mass.
    if gap is None or (not exact_check and gap > LOGPROB_TOLERANCE):
        raise CpuRunError(
            f"step {step}: rollout and actor log-probs differ by {gap} per token (> {LOGPROB_TOLERANCE}): the "
            "rollout server did not get the trained weights"
        )
    return {
        "step": step,
        "pg_loss": data["actor/pg_loss"],
        "grad_norm": data["actor/grad_norm"],
        "logprob_gap": gap,
        "score_mean": data.get("critic/score/mean"),
        "step_s": data.get("timing_s/step"),
    }


def summarize(config: DictConfig, resume_steps: int) -> dict:
    """Check and summarise the two runs of :func:`train_then_resume` (raises :class:`CpuRunError`)."""
    steps = int(config.trainer.total_training_steps)
    first = _read_metrics(config, config.trainer.experiment_name)
    second = _read_metrics(config, f"{config.trainer.experiment_name}{RESUMED_SUFFIX}")
    exact_check = config.actor_rollout_ref.rollout.name == "vllm"
    from verl_ext.methods import get_method

    own_gap_key = f"{get_method(config.algorithm.adv_estimator).prefix}/{OWN_GAP_METRIC}"
    logged = [_checked(e, exact_check, own_gap_key) for e in first + second if "actor/pg_loss" in e["data"]]
    expected = list(range(1, steps + resume_steps + 1))
    if [e["step"] for e in logged] != expected:
        raise CpuRunError(f"steps logged {[e['step'] for e in logged]}, expected {expected} (train, then resume)")
    folder = os.path.join(config.trainer.default_local_dir, f"global_step_{steps}")
    summary = {
        "method": config.algorithm.adv_estimator,
        "trainer_mode": config.trainer.v1.trainer_mode,
        "steps": expected,
        "resumed_from": folder,
        "per_step": logged,
    }
    last = (first + second)[-1]["data"]
    if "diva/difficulty/mean" in last:
        summary["difficulty_mean"] = last["diva/difficulty/mean"]
        summary["collapse_rate_local"] = last.get("diva/collapse_rate/local")
        summary["collapse_rate_global"] = last.get("diva/collapse_rate/global")
    probe_dir = os.environ.get(PROBE_ENV)
    # Named by the first step the resumed trainer runs (verl counts it up before its train-begin hook).
    begin = os.path.join(probe_dir or "", f"train_begin_step{steps + 1}.json")
    if probe_dir and os.path.exists(begin):
        with open(begin) as f:
            state = json.load(f)
        if state["difficulty"] is not None:
            from verl_ext.difficulty.persistence import checkpoint_state_path, load_state

            questions = load_state(checkpoint_state_path(folder))["questions"]
            saved = dict(zip(questions["ids"], questions["difficulty"], strict=True))
            if state["difficulty"] != saved:
                raise CpuRunError("the resumed run's difficulty state differs from the one saved in the checkpoint")
            summary["questions_tracked"] = len(saved)
        summary["probed_steps"] = len(glob.glob(os.path.join(probe_dir, "actor_inputs_step*.pt")))
    if exact_check:
        summary["logprob_check"] = exact_logprob_check(config, probe_dir)
    return summary


def exact_logprob_check(config: DictConfig, probe_dir: str | None) -> dict:
    """:mod:`verl_ext.checks.logprob_check` over every probed step; raises :class:`CpuRunError` when it fails."""
    from verl_ext.checks.logprob_check import LogprobCheckError, check_rollout_logprobs, weights_by_step

    if not probe_dir:
        raise CpuRunError(f"the vLLM rollout's log-prob check reads the actor inputs: set {PROBE_ENV}")
    model = config.actor_rollout_ref.model.path
    try:
        gaps = check_rollout_logprobs(
            probe_dir,
            weights_by_step(model, [config.trainer.default_local_dir]),
            model,
            float(config.actor_rollout_ref.rollout.temperature),
            noise=nc_grpo_noise(config),
        )
    except LogprobCheckError as e:
        raise CpuRunError(str(e)) from e
    return {
        "steps": [g.step for g in gaps],
        "rollout_gap_mean": max(g.rollout_mean for g in gaps),
        "rollout_gap_max": max(g.rollout_max for g in gaps),
        "actor_gap_mean": max(g.actor_mean for g in gaps),
        "displaced_tokens": [g.displaced_tokens for g in gaps],
        "displaced_gap_mean": [g.displaced_gap_mean for g in gaps],
    }


def nc_grpo_noise(config: DictConfig) -> dict | None:
    """NC-GRPO's noise knobs for the exact check (its noisy samples are recomputed displaced), ``None`` for any other
    method."""
    from verl_ext.methods.noise_contrastive_grpo import NAME

    if config.algorithm.adv_estimator != NAME:
        return None
    from verl_ext.nc_grpo.agent_loop import method_config

    knobs = method_config(config)
    return {"scale": float(knobs.noise_scale), "target": knobs.target, "layer": int(knobs.layer)}


def _figure(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def format_summary(summary: dict, json_path: str | None = None) -> str:
    """The run's summary for a person: a header, one line per step, the run's checks; the whole of it (every
    figure) is ``json_path``, written by :func:`write_summary`."""
    steps = summary["steps"]
    lines = [
        f"[cpu] summary: {summary['method']} (trainer {summary['trainer_mode']}), steps {steps[0]}-{steps[-1]}, "
        f"resumed from {summary['resumed_from']}" + (f", {summary['seconds']} s" if "seconds" in summary else ""),
        "[cpu]   step  pg_loss     grad_norm   score   logprob_gap  step_s",
    ]
    for e in summary["per_step"]:
        lines.append(
            f"[cpu]   {e['step']:>4}  {_figure(e['pg_loss']):<10}  {_figure(e['grad_norm']):<10}  "
            f"{_figure(e['score_mean'], 3):<6}  {_figure(e['logprob_gap'], 2):<11}  {_figure(e['step_s'], 3)}"
        )
    if "difficulty_mean" in summary:
        local, other = summary.get("collapse_rate_local"), summary.get("collapse_rate_global")
        restored = summary.get("questions_tracked")
        lines.append(
            f"[cpu]   difficulty mean {_figure(summary['difficulty_mean'], 3)}, collapse rate local "
            f"{_figure(local, 3)}, global {_figure(other, 3)}"
            + (f"; {restored} questions' difficulty restored on resume" if restored is not None else "")
        )
    check = summary.get("logprob_check")
    if check:
        lines.append(
            f"[cpu]   vLLM rollout vs actor log-probs, steps {check['steps']}: mean gap "
            f"{_figure(check['rollout_gap_mean'], 2)} (max {_figure(check['rollout_gap_max'], 2)})"
        )
    if json_path:
        lines.append(f"[cpu]   every figure: {json_path}")
    return "\n".join(lines)


def write_summary(summary: dict, path: str) -> None:
    """The summary as JSON at ``path`` (the run folder's ``summary.json``: what tests and scripts read)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
        f.write("\n")


def pop_cpu_run_block(config: DictConfig) -> dict:
    """Remove the launcher's ``cpu_run`` block (not a verl key) from ``config``; returns it as a dict."""
    if "cpu_run" not in config:
        return {}
    block = OmegaConf.to_container(config.cpu_run, resolve=True)
    with open_dict(config):
        del config["cpu_run"]
    return block or {}
