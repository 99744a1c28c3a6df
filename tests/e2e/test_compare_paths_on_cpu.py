"""``method_run`` (the comparison's and the sweep's runs) hands the job absolute folders: the job runs in Ray's copy
of the repository, so a relative metrics folder would be written there and lost (a sweep with a relative ``OUT``
once finished runs whose ``done.json`` had no metrics beside it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml


def test_a_relative_out_reaches_the_job_as_absolute_folders(tmp_path, monkeypatch):
    from verl_ext.lab import runs

    seen = {}

    def fake_run(argv, cwd, env, stdout, stderr):
        seen["argv"], seen["env"] = argv, env
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(runs.subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    paths = {"model": str(tmp_path / "m"), "train": str(tmp_path / "t.parquet"), "val": str(tmp_path / "v.parquet")}
    out = Path("sweep_out")
    runs.method_run(
        "grpo", paths, out, steps=1, test_freq=1, seed=0, questions=8, rollout_n=4, run_dir=out / "grpo" / "seed0"
    )
    run_dir = tmp_path / "sweep_out" / "grpo" / "seed0"
    env_file = Path(seen["env"]["DIVA_RUNTIME_ENV"])
    assert env_file == run_dir / "runtime_env.yaml"
    logger_root = yaml.safe_load(env_file.read_text())["env_vars"]["VERL_FILE_LOGGER_ROOT"]
    assert os.path.isabs(logger_root) and Path(logger_root) == run_dir / "metrics"
    assert f"trainer.default_local_dir={run_dir / 'checkpoints'}" in seen["argv"]
    assert "trainer.experiment_name=compare_grpo_seed0" in seen["argv"]
