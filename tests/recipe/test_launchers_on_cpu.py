"""The launch scripts: their Hydra overrides compose, a CPU machine fails fast, the preflight passes through
the real `ray job submit` path, and the runtime environment ships no data, history or secrets."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "recipe" / "diva_grpo" / "config"


def has_gpu() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def launcher_overrides(script: str, **env) -> list[str]:
    run_env = {**os.environ, "DIVA_PRINT_ONLY": "1", **env}
    out = subprocess.run(["bash", script], cwd=ROOT, env=run_env, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def compose_overrides(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("diva_grpo", overrides=overrides)


def test_diva_launcher_composes_the_paper_run():
    cfg = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_diva.sh"))
    assert cfg.algorithm.adv_estimator == "diva_grpo"
    assert cfg.trainer.v1.trainer_mode == "diva_grpo"
    assert cfg.data.train_batch_size == 128  # 64 questions x (original + 1 variant)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 128  # one optimizer update per step
    assert cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == pytest.approx(1e-2)
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "constant"
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.3)
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert not cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (2048, 4096)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == pytest.approx(0.6)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.top_p == pytest.approx(0.95)
    assert cfg.trainer.total_epochs == 5
    assert cfg.diva.variants.max_pixels == 1048576
    assert cfg.data.diva.advantage.k == pytest.approx(0.1)  # the dataset sees the same diva block


def test_environment_overrides_reach_the_config():
    cfg = compose_overrides(
        launcher_overrides(
            "run_scripts/qwen25vl7b_diva.sh", VARIANTS_PER_QUESTION="3", QUESTIONS_PER_STEP="32", LR="2e-6"
        )
    )
    assert cfg.diva.variants.variants_per_question == 3
    assert cfg.data.train_batch_size == 128
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(2e-6)


def test_grpo_baseline_has_the_same_response_budget():
    diva = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_diva.sh"))
    grpo = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_grpo.sh"))
    # verl's GRPO estimator on the toolkit trainer (it logs grpo/collapse_rate); TRAINER_MODE=sync: verl's trainer.
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.trainer.v1.trainer_mode == "toolkit"
    plain = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_grpo.sh", TRAINER_MODE="sync"))
    assert plain.trainer.v1.trainer_mode == "sync"
    # verl's own dataset on the same parquet, the images limited as DIVA's are (the same MAX_PIXELS)
    assert grpo.data.custom_cls.path == "pkg://verl_ext.data.pixel_limit"
    assert grpo.data.custom_cls.name == "PixelLimitedDataset"
    assert grpo.diva.variants.max_pixels == diva.diva.variants.max_pixels
    assert grpo.actor_rollout_ref.rollout.n == 10
    assert grpo.data.train_batch_size * grpo.actor_rollout_ref.rollout.n == (
        diva.data.train_batch_size * diva.actor_rollout_ref.rollout.n
    )


def test_smoke_launcher_runs_two_steps_on_one_gpu(tmp_path):
    cfg = compose_overrides(
        launcher_overrides(
            "run_scripts/smoke_1gpu.sh", TRAIN_FILES=str(tmp_path / "t.parquet"), VAL_FILES=str(tmp_path / "v.parquet")
        )
    )
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.n_gpus_per_node == 1
    assert cfg.data.train_batch_size % (1 + cfg.diva.variants.variants_per_question) == 0


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
def test_cpu_machine_fails_fast_and_names_the_preflight():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN")}
    started = time.monotonic()
    out = subprocess.run(["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    assert out.returncode != 0
    assert "no NVIDIA GPU" in out.stderr
    assert "DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh" in out.stderr
    assert elapsed < 60  # "within seconds": generous for a loaded CI machine; it starts no Ray


def test_max_restarts_must_be_a_count():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN")}
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env={**env, "MAX_RESTARTS": "three"}, capture_output=True
    )
    assert out.returncode == 2
    assert b"MAX_RESTARTS=three: expected how many times to resubmit a failed job" in out.stderr


def test_runtime_env_ships_code_without_history_data_or_secrets(tmp_path):
    from ray._private.runtime_env.packaging import create_package

    runtime_env = yaml.safe_load((ROOT / "recipe/diva_grpo/runtime_env.yaml").read_text())
    assert runtime_env["working_dir"] == "./"
    assert runtime_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == "verl_ext.plugin"
    tree = tmp_path / "repo"
    for name in [
        ".git/config",
        "data/train.parquet",
        "checkpoints/global_step_1/actor/model.pt",
        "outputs/run.log",
        "benchmarks/results/sweep_tiny/grpo/seed0/train.log",
        "elsewhere/extra.parquet",
        ".env",
        "configs/prod.env",
        "keys/server.pem",
        "secrets.yaml",
        "verl_ext/config.py",
        "recipe/diva_grpo/trainer.py",
        "run_scripts/qwen25vl7b_diva.sh",
    ]:
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    package = tmp_path / "pkg.zip"
    create_package(str(tree), package, include_gitignore=True, excludes=runtime_env["excludes"])
    shipped = {name for name in zipfile.ZipFile(package).namelist() if not name.endswith("/")}
    assert shipped == {"verl_ext/config.py", "recipe/diva_grpo/trainer.py", "run_scripts/qwen25vl7b_diva.sh"}


@pytest.mark.launch  # a Ray head, ray job submit and the preflight: the launch tier
def test_preflight_through_ray_job_submit(diva_dry_run):
    """DRY_RUN=1 on a CPU machine: local Ray head on 127.0.0.1, `ray job submit`, preflight, exit 0, head stopped
    (the launch: ``tests/conftest.py``'s ``diva_dry_run``, which the report's tests read too)."""
    log = diva_dry_run["console"]
    assert diva_dry_run["returncode"] == 0, log[-4000:]
    assert "[preflight] PASSED" in log
    if not (ROOT / "data" / "diva_train.parquet").exists():
        assert "writing a synthetic set" in log
    assert "succeeded" in log


@pytest.mark.gpu
def test_smoke_run_on_one_gpu():
    """Two DIVA steps of a small VLM on one GPU (needs the model locally or a hub; skipped without CUDA)."""
    out = subprocess.run(["bash", "run_scripts/smoke_1gpu.sh"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]


def test_preflight_refuses_a_named_data_file_that_is_missing(tmp_path):
    from recipe.diva_grpo.preflight import PreflightError, preflight_config

    cfg = compose_overrides([f"data.train_files={tmp_path}/mine.parquet", "diva.dry_run=true"])
    with pytest.raises(PreflightError, match="mine.parquet"):
        preflight_config(cfg, str(tmp_path))


def test_preflight_is_for_the_diva_recipe():
    from recipe.diva_grpo.preflight import PreflightError, run_preflight

    # verl's own trainer (the GRPO launcher with TRAINER_MODE=sync) is not what the preflight simulates.
    cfg = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_grpo.sh", DRY_RUN="1", TRAINER_MODE="sync"))
    with pytest.raises(PreflightError, match="qwen25vl7b_diva.sh.*without TRAINER_MODE=sync"):
        run_preflight(cfg)


def test_launcher_paths_are_absolute():
    overrides = launcher_overrides("run_scripts/qwen25vl7b_diva.sh", TRAIN_FILES="rel/train.parquet")
    values = dict(item.split("=", 1) for item in overrides)
    for key in ("data.train_files", "data.val_files", "trainer.default_local_dir"):
        assert os.path.isabs(values[key]), (key, values[key])
    assert values["data.train_files"] == str(ROOT / "rel/train.parquet")


def run_submit_cleanup(
    tmp_path: Path, rm_failures: int, job_status: int, logs_dir: Path | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """_submit.sh's own `cleanup` (cut out of the script, run under its `set -euo pipefail` as its EXIT trap) after a
    job that ended with `job_status`, with an `rm` that fails `rm_failures` times first, as it does while Ray's
    workers still write into their session folder ("Directory not empty")."""
    script = (ROOT / "run_scripts" / "_submit.sh").read_text()
    start = script.index("cleanup() {")
    cleanup = script[start : script.index("\n}\n", start) + 3]
    ray_tmp = tmp_path / "diva_ray_test"
    (ray_tmp / "session_1" / "logs").mkdir(parents=True)
    (ray_tmp / "session_1" / "logs" / "raylet.out").write_text("raylet's log\n")
    (ray_tmp / "session_latest").symlink_to(ray_tmp / "session_1")
    (ray_tmp / "head.log").write_text("head's log\n")
    shim = tmp_path / "bin"
    shim.mkdir()
    counter = tmp_path / "rm_calls"
    real_rm = shutil.which("rm")
    (shim / "rm").write_text(
        "#!/usr/bin/env bash\n"
        f'n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo "$n" > {counter}\n'
        f'if [ "$n" -le {rm_failures} ]; then echo "rm: cannot remove: Directory not empty" >&2; exit 1; fi\n'
        f'exec {real_rm} "$@"\n'
    )
    (shim / "rm").chmod(0o755)
    (shim / "sleep").write_text("#!/usr/bin/env bash\nexit 0\n")  # the retries' pauses, skipped
    (shim / "sleep").chmod(0o755)
    body = (
        f"set -euo pipefail\n{cleanup}\n"
        f'HEAD_PID=""\ndeclare -a NODE_PIDS=()\nRAY_TMP="{ray_tmp}"\nRAY_LOGS_DIR="{logs_dir or ""}"\n'
        f"trap cleanup EXIT\nexit {job_status}\n"
    )
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", body], env=env, capture_output=True, text=True), ray_tmp


def test_a_finished_job_keeps_exit_0_when_rays_temp_folder_is_briefly_busy(tmp_path):
    done, ray_tmp = run_submit_cleanup(tmp_path, rm_failures=2, job_status=0)
    assert done.returncode == 0, done.stderr
    assert not ray_tmp.exists()


def test_a_temp_folder_that_stays_busy_is_kept_with_a_note_and_exit_0(tmp_path):
    done, ray_tmp = run_submit_cleanup(tmp_path, rm_failures=100, job_status=0)
    assert done.returncode == 0, done.stderr
    assert ray_tmp.exists()
    assert f"Ray's temp folder {ray_tmp} is still in use and was kept" in done.stderr


def test_a_failed_job_keeps_its_status_and_rays_logs_beside_the_jobs_log(tmp_path):
    logs = tmp_path / "ckpt" / "logs" / "job_1_ray"
    done, ray_tmp = run_submit_cleanup(tmp_path, rm_failures=0, job_status=3, logs_dir=logs)
    assert done.returncode == 3
    assert (logs / "head.log").read_text() == "head's log\n"
    assert (logs / "session_logs" / "raylet.out").read_text() == "raylet's log\n"
    assert not ray_tmp.exists()  # nothing left in /tmp
    assert f"Ray's logs of this launch: {logs}" in done.stderr
    # where the job's log folder cannot be written, Ray's temp folder is kept and named
    (tmp_path / "a_file").write_text("")
    done, ray_tmp = run_submit_cleanup(tmp_path / "b", 0, 3, logs_dir=tmp_path / "a_file" / "x")
    assert done.returncode == 3 and ray_tmp.exists() and f"Ray's logs of this launch: {ray_tmp}" in done.stderr
