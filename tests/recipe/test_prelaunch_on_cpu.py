"""The launcher's data check before Ray starts (recipe/diva_grpo/prelaunch.py), through the real launch scripts: the
user's own files are the ones checked, and a preflight on the synthetic set says so on its first and last lines."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_prep.synth import synth
from recipe.diva_grpo.prelaunch import check_launch, launch_config, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("prelaunch")
    train, val, plain = root / "train.parquet", root / "val.parquet", root / "plain.parquet"
    synth(str(train), 6, seed=0, split="train")
    synth(str(val), 3, seed=1, split="test")
    pq.write_table(pq.read_table(train).drop_columns(["hint_steps"]), plain)
    return train, val, plain


def _without_data_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN", "DIVA_PRINT_ONLY")}


def launch(tmp_path, **env) -> tuple[subprocess.CompletedProcess, float]:
    run_env = _without_data_env()
    for name in ("TRAIN_FILES", "VAL_FILES"):
        run_env.pop(name, None)
    # TMPDIR: this test's own, where a Ray head's temp folder would be made (other runs on the machine make theirs
    # in /tmp meanwhile).
    run_env.update(CKPT_DIR=str(tmp_path / "ckpt"), TMPDIR=str(tmp_path), **env)
    started = time.monotonic()
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300
    )
    elapsed = time.monotonic() - started
    print(f"launcher exited {out.returncode} in {elapsed:.1f} s")
    # No Ray head was started: its temp folder (in TMPDIR, this test's own) was never made.
    assert not glob.glob(str(tmp_path / "diva_ray_*"))
    return out, elapsed


def test_same_file_is_refused_before_any_ray_process(files, tmp_path):
    train, _, _ = files
    out, elapsed = launch(tmp_path, DRY_RUN="1", TRAIN_FILES=str(train), VAL_FILES=str(train))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "data.train_files and data.val_files are the same files" in out.stderr and str(train) in out.stderr
    assert "Ray head" not in out.stdout and "Traceback" not in out.stderr
    assert elapsed < 60  # seconds, not a minute of Ray start-up (generous for a loaded CI machine)


def test_missing_diva_columns_refused_before_submitting_to_a_cluster(files, tmp_path):
    _, val, plain = files
    # A cluster address that is never reached: the check runs before `ray job submit`.
    out, _ = launch(tmp_path, RAY_ADDRESS="http://127.0.0.1:9", TRAIN_FILES=str(plain), VAL_FILES=str(val))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "lack the DIVA column(s) ['hint_steps']" in out.stderr and str(plain) in out.stderr
    assert "submitting" not in out.stdout


def test_good_files_pass_and_the_metrics_log_folder_is_created(files, tmp_path, capsys):
    train, val, _ = files
    log = tmp_path / "run" / "logs" / "metrics.jsonl"
    overrides = [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={log}",
    ]
    assert main(overrides) == 0
    out = capsys.readouterr().out
    assert f"[diva] train data {train}: 6 rows, OK" in out and f"[diva] val data {val}: 3 rows, OK" in out
    assert "config and data checked in" in out
    assert log.parent.is_dir() and not log.exists()


def test_preflight_defaults_and_remote_paths_are_left_to_the_job(files, tmp_path):
    train, _, _ = files
    default = [f"data.train_files={ROOT}/data/diva_train.parquet", f"data.val_files={ROOT}/data/diva_val.parquet"]
    if not (ROOT / "data" / "diva_train.parquet").exists():
        # DRY_RUN: the preflight writes a synthetic set when the recipe's default files are absent
        assert check_launch([*default, "diva.dry_run=true"], remote=False)["checked"] == []
        with pytest.raises(ValueError, match="does not exist"):
            check_launch(default, remote=False)
    # a path only the cluster sees
    elsewhere = str(tmp_path / "cluster_only" / "val.parquet")
    report = check_launch([f"data.train_files={train}", f"data.val_files={elsewhere}"], remote=True)
    assert report["skipped"] == [elsewhere] and report["checked"] == [str(train)]


def test_grpo_baseline_checks_verls_columns_only(files):
    _, val, plain = files
    overrides = [f"data.train_files={plain}", f"data.val_files={val}", "data.custom_cls.path=null"]
    overrides.append("data.custom_cls.name=null")
    assert check_launch(overrides, remote=False)["checked"] == [str(plain), str(val)]
    # the same file as training and validation data is refused for every method: validation would measure nothing
    with pytest.raises(ValueError, match="the same files"):
        check_launch([*overrides[:1], f"data.val_files={plain}", *overrides[2:]], remote=False)


def test_overrides_compose_like_hydra():
    cfg = launch_config(["data.train_files=[a.parquet,b.parquet]", "~trainer.logger", "+x.y=1", "++diva.dry_run=true"])
    assert list(cfg.data.train_files) == ["a.parquet", "b.parquet"]
    assert "logger" not in cfg.trainer and cfg.x.y == 1 and cfg.diva.dry_run is True


def test_check_imports_neither_torch_nor_ray(files):
    train, val, _ = files
    code = (
        "import sys; from recipe.diva_grpo.prelaunch import check_launch; "
        f"check_launch(['data.train_files={train}', 'data.val_files={val}'], remote=False); "
        "print(sorted(m for m in ('torch', 'ray', 'verl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_launcher_writes_verls_file_logger_into_the_run_folder(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    env = {**os.environ, "DIVA_PRINT_ONLY": "1", "CKPT_DIR": str(tmp_path / "run")}
    launches = [
        subprocess.run(["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    overrides = [out.stdout.split() for out in launches]
    with initialize_config_dir(config_dir=str(ROOT / "recipe/diva_grpo/config"), version_base=None):
        configs = [compose("diva_grpo", overrides=o) for o in overrides]
    assert list(configs[0].trainer.logger) == ["console", "file"]
    paths = [cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH for cfg in configs]
    assert all(Path(p).parent == tmp_path / "run" / "logs" and p.endswith(".jsonl") for p in paths)
    assert paths[0] != paths[1]  # verl's logger truncates its file: every launch (a resume too) gets its own
    # what verl's run_ppo passes to ray.init, so that the task runner (where the logger lives) sees the variable
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(configs[0]), configs[0].ray_kwargs.ray_init.runtime_env)
    assert runtime_env.env_vars.VERL_FILE_LOGGER_PATH == paths[0]


# The cases a newcomer met (issue "A newcomer's first hour"): the user's data is never replaced by the synthetic set.
def test_a_named_training_file_without_a_validation_file_is_refused_not_replaced(files, tmp_path):
    train, _, _ = files
    out, elapsed = launch(tmp_path, DRY_RUN="1", TRAIN_FILES=str(train))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"the data file(s) ['{train}'] are named but" in out.stderr and "diva_val.parquet" in out.stderr
    assert "name the training and the validation files both" in out.stderr
    assert "synthetic" not in out.stdout and "starting a local Ray head" not in out.stdout
    assert elapsed < 30  # seconds (about 2 alone; CI runs another test process beside), not a Ray start-up


def test_a_file_that_is_not_parquet_is_refused(files, tmp_path):
    _, val, _ = files
    out, elapsed = launch(tmp_path, DRY_RUN="1", TRAIN_FILES=str(ROOT / "README.md"), VAL_FILES=str(val))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"data file {ROOT / 'README.md'} is not a parquet file" in out.stderr
    assert "left to the job" not in out.stdout and elapsed < 30  # about 2 s alone; CI runs another process beside
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    out, _ = launch(tmp_path, TRAIN_FILES=str(fake), VAL_FILES=str(val), RAY_ADDRESS="http://127.0.0.1:9")
    assert out.returncode == 2 and f"data file {fake} is not a readable parquet file" in out.stderr


def test_a_validation_file_without_verls_columns_is_refused(files, tmp_path):
    train, val, _ = files
    bare = tmp_path / "bare_val.parquet"
    pq.write_table(pq.read_table(val).drop_columns(["reward_model"]), bare)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['reward_model'\]") as err:
        check_launch([f"data.train_files={train}", f"data.val_files={bare}"], remote=False)
    assert str(bare) in str(err.value)


def test_the_users_files_are_the_ones_the_preflight_checks(files, capsys):
    train, val, _ = files
    assert main([f"data.train_files={train}", f"data.val_files={val}", "diva.dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert f"train data {train}: 6 rows, OK" in out and "synthetic" not in out


def test_with_no_data_named_the_first_and_last_lines_say_the_synthetic_set(tmp_path):
    if (ROOT / "data" / "diva_train.parquet").exists():
        pytest.skip("this checkout has prepared data at the recipe's default paths")
    # A cluster address that is never reached: the launch ends after the checks, as every launch does, with the note.
    env = _without_data_env()
    for name in ("TRAIN_FILES", "VAL_FILES"):
        env.pop(name, None)
    env.update(CKPT_DIR=str(tmp_path / "ckpt"), DRY_RUN="1", RAY_ADDRESS="http://127.0.0.1:9")
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert out.returncode == 2 and "cannot reach a Ray cluster at http://127.0.0.1:9" in out.stdout
    assert "Traceback" not in out.stdout
    for line in (lines[0], lines[-1]):
        assert "this preflight runs on a synthetic set, not on your data" in line, line
