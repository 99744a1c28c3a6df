"""CPU preflight: everything a DIVA-GRPO (or other toolkit method's) run does before the GPUs matter, in a minute.

Run it with ``DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh`` (or any ``qwen25vl7b_<method>.sh``: the same
``ray job submit`` path as a real run). It checks, in order, and stops at the first failure with the reason:

1. the composed config validates (DIVA knobs, the failed-request retries, batch-size rules, verl's own checks);
2. the data loads (``diva-prep synth`` data is generated when the configured files are absent);
3. the first training batch holds each question's original and variants, with images perturbed and as
   many ``<image>`` placeholders as images;
4. the reward function gives full marks to gold answers;
5. the difficulty service starts, and the real DIVA trainer runs steps on simulated rollouts
   (:mod:`recipe.diva_grpo.simulation`): advantage, difficulty update, shared-table refresh, metrics;
6. a checkpoint is saved, a second trainer resumes from it with exactly the same difficulty state and
   sampler position, and trains one more step.

For the toolkit's other methods (``trainer.v1.trainer_mode=toolkit``) steps 3 and 5's difficulty checks are
DIVA's own and are skipped; step 6 checks the method's batch-planner state instead (CoDaPO's resampler).

The model is not loaded: the rollout and the FSDP workers are the only stand-ins.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from copy import deepcopy

import ray
from omegaconf import DictConfig, OmegaConf, open_dict
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from recipe.diva_grpo.prelaunch import _as_list, uses_synthetic_data
from verl_ext.cluster.batch_arithmetic import check_batch_arithmetic
from verl_ext.config import diva_config_from
from verl_ext.rollout.request_retry import requests_config

PREFLIGHT_QUESTIONS_PER_STEP = 4
PREFLIGHT_STEPS = 3
DIVA_MODE = "diva_grpo"
TOOLKIT_MODE = "toolkit"


class PreflightError(RuntimeError):
    """A preflight check failed; the message says which and what to do."""


def _log(msg: str) -> None:
    print(f"[preflight] {msg}", flush=True)


def _ensure_data(config: DictConfig, workdir: str) -> tuple[str, str]:
    """The files the preflight reads: the user's, or (no data named at all) a synthetic set written into
    ``workdir``; returns ``(train, val)``. The launcher made the same choice (``uses_synthetic_data``)."""
    train, val = config.data.train_files, config.data.val_files
    try:
        synthetic = uses_synthetic_data(train, val)
    except ValueError as err:
        raise PreflightError(str(err)) from None
    if not synthetic:
        missing = [path for path in _as_list(train) + _as_list(val) if "://" not in path and not os.path.exists(path)]
        if missing:
            raise PreflightError(
                f"data file(s) {missing} not found. Prepare them with `diva-prep convert` / `diva-prep variants`, or "
                "leave TRAIN_FILES and VAL_FILES unset to preflight on a synthetic set"
            )
        return train, val
    from data_prep.synth import synth

    _log(f"no data named: writing a synthetic set into {workdir} (not your data)")
    train = os.path.join(workdir, "synth_train.parquet")
    val = os.path.join(workdir, "synth_val.parquet")
    synth(train, 48, seed=0, split="train")
    synth(val, 8, seed=1, split="test")
    if config.algorithm.adv_estimator == "durian":
        train = _with_visual_entropy(train, workdir)
    return train, val


def _with_visual_entropy(train: str, workdir: str) -> str:
    """Durian reads extra_info.visual_entropy: fill it the way a user does (``diva-prep entropy``), with a tiny
    randomly initialised Qwen2-VL vision tower built here standing in for the policy (no model is loaded)."""
    from pathlib import Path

    from data_prep.entropy import EntropyOptions, run_entropy
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    model = build_tiny_qwen2_vl(os.path.join(workdir, "tiny_vision_model"))
    out = os.path.join(workdir, "synth_train_entropy.parquet")
    summary = run_entropy(train, out, EntropyOptions(model=Path(model), device="cpu", progress=False))
    _log(f"durian: visual entropy of {summary.rows_written} rows by diva-prep entropy (tiny stand-in encoder)")
    return out


def preflight_config(config: DictConfig, workdir: str) -> DictConfig:
    """The user's config, shrunk to CPU size: same method knobs and algorithm, few prompts, no model."""
    cfg = deepcopy(config)
    diva = cfg.trainer.v1.trainer_mode == DIVA_MODE
    group = 1 + diva_config_from(cfg.diva).variants.variants_per_question if diva else 1
    train, val = _ensure_data(cfg, workdir)
    with open_dict(cfg):
        cfg.data.train_files = train
        cfg.data.val_files = val
        cfg.data.train_batch_size = PREFLIGHT_QUESTIONS_PER_STEP * group
        cfg.data.gen_batch_size = None
        cfg.data.dataloader_num_workers = 2
        # No processor without the model: prompt lengths are not measured here.
        cfg.data.filter_overlong_prompts = False
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = cfg.data.train_batch_size
        cfg.trainer.total_training_steps = PREFLIGHT_STEPS
        cfg.trainer.total_epochs = 1
        cfg.trainer.save_freq = PREFLIGHT_STEPS - 1
        # Validation before training and after every step, on the configured validation files: verl's val-core
        # metrics reach the metrics log (one accuracy per data_source), as in a real run.
        cfg.trainer.test_freq = 1
        cfg.trainer.val_before_train = True
        cfg.trainer.resume_mode = "auto"
        cfg.trainer.default_local_dir = os.path.join(workdir, "checkpoints")
        cfg.trainer.logger = ["file"]
        cfg.transfer_queue.enable = True
        if cfg.algorithm.adv_estimator == "mupo" and _no_embedding_endpoint(cfg.mupo.embedding):
            # No endpoint named: the preflight embeds with the model-free backend (it names the swap); a named
            # endpoint is used for real, so an unreachable one fails here as it would in the job.
            _log("mupo: no embedding endpoint set (MUPO_EMBEDDING_BASE_URL): embedding with hashed trigrams instead")
            cfg.mupo.embedding.backend = "hashing"
    return cfg


def _no_embedding_endpoint(embedding) -> bool:
    from verl_ext.mupo.embeddings_client import BASE_URL_ENV

    return embedding.backend == "openai" and not (embedding.base_url or os.environ.get(BASE_URL_ENV))


def check_first_batch(trainer) -> dict:
    """Whole question groups, every variant kind reachable, placeholders equal images.

    Reads through a loader of its own (same dataset, same sampler kind) so the trainer's loader state is untouched.
    The shared difficulty table is set to a spread of easy, middling and hard values for this read only, so that
    the planner's image perturbations, paraphrases and hints all run, then restored.
    """
    import torch
    from torch.utils.data import DataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    from verl_ext.data.sampler import QuestionBlockSampler

    table = trainer.train_dataset.difficulty_table
    saved = table.values.clone()
    bounds = trainer.diva.difficulty
    spread = torch.tensor([bounds.d_min, (bounds.d_min + bounds.d_max) / 2, bounds.d_max], dtype=table.values.dtype)
    table.values.copy_(spread[torch.arange(len(table)) % 3])
    try:
        sampler = QuestionBlockSampler(trainer.train_dataset, shuffle=False, seed=0)
        loader = DataLoader(
            trainer.train_dataset,
            batch_size=3 * trainer.train_dataset.block_size,
            sampler=sampler,
            collate_fn=collate_fn,
        )
        batch = next(iter(loader))
    finally:
        table.values.copy_(saved)
    infos = list(batch["extra_info"])
    kinds = [info["variant_kind"] for info in infos]
    qids = [info["question_id"] for info in infos]
    group = trainer.train_dataset.block_size
    for start in range(0, len(qids), group):
        block = qids[start : start + group]
        if len(set(block)) != 1:
            raise PreflightError(f"question group split in the first batch: rows {start}..{start + group - 1} {block}")
    for i, messages in enumerate(batch["raw_prompt"]):
        parts = [c for m in messages for c in (m["content"] if isinstance(m["content"], list) else [])]
        if any("<image>" in c.get("text", "") for c in parts):
            raise PreflightError(f"row {i} ({qids[i]}): an <image> placeholder was not matched to an image")
        if not any(c.get("type") == "image" for c in parts):
            raise PreflightError(f"row {i} ({qids[i]}): no image in the prompt")
    variant_kinds = {kind for kind in kinds if kind != "original"}
    if len(variant_kinds) < 2:
        raise PreflightError(
            f"easy, middling and hard questions all produced {sorted(variant_kinds)} variants: check the planner "
            "(diva.variants.planner) and the data's paraphrases and hint_steps (diva-prep validate)"
        )
    perturbations = sorted({info["variant_perturbation"] for info in infos} - {"none"})
    return {
        "prompts": len(qids),
        "questions": len(set(qids)),
        "kinds": dict(Counter(kinds)),
        "perturbations": perturbations,
    }


def check_reward_on_gold(dataset, reward_fn, rows: int = 8) -> int:
    frame = dataset.dataframe
    for i in range(min(rows, len(frame))):
        row = frame[i]
        gt = str(row["reward_model"]["ground_truth"])
        result = reward_fn(row["data_source"], f"<think>reasoning</think> so the answer is \\boxed{{{gt}}}", gt, {})
        if result["score"] < 0.999:
            raise PreflightError(
                f"the reward function scores the gold answer of row {i} ({gt!r}) {result['score']:.3f}, not 1.0: "
                "check reward.custom_reward_function and the ground_truth format"
            )
    return min(rows, len(frame))


# verl's file logger truncates its file when it opens it: one file per trainer, in write order (diva-report merges
# the files of a run folder in that order).
METRICS_LOGS = ("metrics_1_before_resume.jsonl", "metrics_2_after_resume.jsonl")


def _read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _resumable_state(trainer, diva: bool):
    """What a resume must restore beyond verl's own checkpoint: the difficulty state, or the planner's state."""
    if diva:
        return trainer.difficulty.snapshot()
    return trainer.batch_planner.state_dict() if trainer.batch_planner is not None else None


def simulated_rollout_fields(cfg: DictConfig):
    """What the configured agent loop adds to each trajectory's ``extra_fields`` (NC-GRPO's loop: the noise flag,
    by its own code), for the simulated rollouts; ``None`` for verl's and the seeded loop, which add nothing."""
    from verl_ext.nc_grpo.noise import AGENT_LOOP_NAME

    rollout = cfg.actor_rollout_ref.rollout
    if (rollout.get("agent", {}) or {}).get("default_agent_loop") != AGENT_LOOP_NAME:
        return None
    from verl_ext.nc_grpo.agent_loop import method_config, trajectory_fields

    knobs = method_config(cfg)
    return lambda kwargs: trajectory_fields(rollout, knobs, kwargs)


def run_preflight(config: DictConfig) -> dict:
    """Run all checks; returns the summary (also printed). Raises :class:`PreflightError` on failure."""
    import transfer_queue as tq
    from verl.utils.import_utils import load_extern_object

    import recipe.diva_grpo.trainer  # noqa: F401  (registers the trainers)
    from recipe.diva_grpo.console import quiet_console, stdout_to
    from recipe.diva_grpo.simulation import SimulatedAgentLoopManager, build_simulated_trainer
    from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer
    from recipe.diva_grpo.trainer import DivaTrainer

    started = time.perf_counter()
    mode = config.trainer.v1.trainer_mode
    if mode not in (DIVA_MODE, TOOLKIT_MODE):
        raise PreflightError(
            f"the preflight checks the toolkit's recipes (trainer.v1.trainer_mode={DIVA_MODE} or {TOOLKIT_MODE}), "
            f"not {mode!r}: run it as DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh, or the qwen25vl7b_<method>.sh "
            "of a toolkit method (the GRPO baseline's qwen25vl7b_grpo.sh too, without TRAINER_MODE=sync)"
        )
    diva = mode == DIVA_MODE
    trainer_cls = DivaTrainer if diva else ToolkitTrainer
    # A fresh folder each run (under DIVA_PREFLIGHT_DIR when set), so no earlier preflight's checkpoint is resumed.
    parent = os.environ.get("DIVA_PREFLIGHT_DIR")
    if parent:
        os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="diva_preflight_", dir=parent)
    _log(f"work folder {workdir}")
    # Third-party warnings go to the full log only (recipe/diva_grpo/console.py).
    full_log = os.path.join(workdir, "preflight.log")
    quiet_console(full_log)

    # 1. config
    diva_config_from(config.diva)
    requests_config(config)  # the rollout_requests block (read by the agent loop at the first request otherwise)
    # The rows each rank of the configured cluster gets in every pass (the run's own settings, before the preflight
    # shrinks them to this machine).
    for line in check_batch_arithmetic(config).lines():
        _log(f"batch: {line}")
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    cfg = preflight_config(config, workdir)
    OmegaConf.resolve(cfg)
    synthetic = uses_synthetic_data(config.data.train_files, config.data.val_files)  # preflight_config checked it
    _log(
        f"config OK: adv_estimator={cfg.algorithm.adv_estimator}, trainer_mode={cfg.trainer.v1.trainer_mode}, "
        f"variants_per_question={cfg.diva.variants.variants_per_question}, rollout.n={cfg.actor_rollout_ref.rollout.n}"
    )

    # The actors' output stays in Ray's session logs instead of being echoed here.
    if not ray.is_initialized():
        ray.init(namespace=f"diva_preflight_{os.getpid()}", log_to_driver=False)
    tq.init(cfg.transfer_queue)
    quiet_console(full_log)  # loggers TransferQueue creates when it starts
    reward_fn = load_extern_object(cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name)
    try:
        # 2-3. data and first batch
        trainer = build_simulated_trainer(trainer_cls, cfg)
        if diva:
            first = check_first_batch(trainer)
            _log(f"data OK: {len(trainer.train_dataset)} train prompts; first batch {first}")
        else:
            _log(f"data OK: {len(trainer.train_dataset)} train prompts (verl's dataset, no variants)")
        # 4. reward
        checked = check_reward_on_gold(trainer.train_dataset, reward_fn)
        _log(f"reward OK: gold answers of {checked} rows score 1.0")
        # 5. steps on simulated rollouts, checkpoint at step PREFLIGHT_STEPS - 1
        fields = simulated_rollout_fields(cfg)
        trainer.total_training_steps = PREFLIGHT_STEPS - 1
        # verl's file logger truncates its file when it opens: one file per trainer.
        os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(workdir, METRICS_LOGS[0])
        with stdout_to(full_log):  # verl prints every validation metric at the start and end of fit
            trainer.fit(SimulatedAgentLoopManager(reward_fn, n=cfg.actor_rollout_ref.rollout.n, rollout_fields=fields))
        saved = _resumable_state(trainer, diva)
        if diva:
            if not saved:
                raise PreflightError("the difficulty service holds no question after training steps")
            # A resumed run starts a new service actor: the state must come from the checkpoint, not from memory.
            trainer.difficulty.stop()
        # 6. resume from the checkpoint in a fresh trainer and train one more step
        resumed = build_simulated_trainer(trainer_cls, cfg)
        if resumed.global_steps != PREFLIGHT_STEPS - 1:
            raise PreflightError(f"resume found step {resumed.global_steps}, expected {PREFLIGHT_STEPS - 1}")
        if _resumable_state(resumed, diva) != saved:
            what = "difficulty state" if diva else f"{resumed.method.name} batch planner state"
            raise PreflightError(f"the {what} after resume differs from the one saved with the checkpoint")
        os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(workdir, METRICS_LOGS[1])
        with stdout_to(full_log):
            resumed.fit(SimulatedAgentLoopManager(reward_fn, n=cfg.actor_rollout_ref.rollout.n, rollout_fields=fields))
    finally:
        tq.close()

    logged = [entry for name in METRICS_LOGS for entry in _read_metrics(os.path.join(workdir, name))]
    # Training lines; the validation-only lines (before training, and again on resume) are checked below.
    training = [entry for entry in logged if any(not key.startswith("val-") for key in entry["data"])]
    last = training[-1]["data"] if training else {}
    validation = {key: value for entry in logged for key, value in entry["data"].items() if key.startswith("val-core/")}
    if not validation:
        raise PreflightError(
            "validation logged no val-core metrics: check data.val_files and the reward function's 'acc' key"
        )
    summary = {"steps": [entry["step"] for entry in training], "method": cfg.algorithm.adv_estimator}
    if diva:
        summary.update(
            questions_tracked=len(resumed.difficulty.snapshot()),
            difficulty_mean=last.get("diva/difficulty/mean"),
            collapse_rate_local=last.get("diva/collapse_rate/local"),
            collapse_rate_global=last.get("diva/collapse_rate/global"),
        )
    else:
        prefix = f"{resumed.method.prefix}/"
        summary.update({key: value for key, value in sorted(last.items()) if key.startswith(prefix + "collapse_rate")})
    summary["checkpoint"] = os.path.join(cfg.trainer.default_local_dir, f"global_step_{PREFLIGHT_STEPS - 1}")
    summary["validation"] = {key: round(value, 4) for key, value in sorted(validation.items())}
    summary["seconds"] = round(time.perf_counter() - started, 1)
    _log("summary " + json.dumps(summary, default=str))
    _log(f"full log (third-party warnings included): {full_log}")
    _log(f"plots of this run: diva-report {workdir} --output {os.path.join(workdir, 'report')}")
    method = cfg.algorithm.adv_estimator
    checked = "variants, reward, difficulty service, DIVA steps" if diva else f"reward, {method} steps"
    data = "a synthetic set (no data named: not your data)" if synthetic else f"your data ({_files(config)})"
    _log(f"PASSED on {data}: config, data, {checked}, checkpoint and resume")
    return summary


def _files(config: DictConfig) -> str:
    return f"train {', '.join(_as_list(config.data.train_files))}; val {', '.join(_as_list(config.data.val_files))}"
