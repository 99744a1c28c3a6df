"""The job's final config, composed and checked by the launcher before any Ray process starts
(recipe/diva_grpo/job_config.py): the same config the job composes, and each bad override refused in seconds with a
message that names the argument, the key and what is valid, through the real launch scripts."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.diva_grpo.job_config import CONFIG_DIR, ConfigError, compose_job_config, recipe_blocks

ROOT = Path(__file__).resolve().parents[2]


def launcher_overrides(script: str, **env) -> list[str]:
    run_env = {**os.environ, "DIVA_PRINT_ONLY": "1", **env}
    out = subprocess.run(["bash", script], cwd=ROOT, env=run_env, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.parametrize("script", ["qwen25vl7b_diva.sh", "qwen25vl7b_noise_contrastive_grpo.sh"])
def test_the_launcher_composes_what_the_job_composes(script):
    overrides = launcher_overrides(f"run_scripts/{script}")
    # The job: Hydra with the recipe's own search path (pkg://verl.trainer.config, which imports verl).
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        job = compose("diva_grpo", overrides=overrides)
    mine = compose_job_config(overrides)
    assert OmegaConf.to_container(mine, resolve=False) == OmegaConf.to_container(job, resolve=False)


def test_composing_imports_neither_verl_nor_torch():
    code = (
        "import sys; from recipe.diva_grpo.job_config import compose_job_config; "
        "compose_job_config(['trainer.total_epochs=3']); "
        "print(sorted(m for m in ('torch', 'ray', 'verl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_recipes_own_blocks_are_the_typed_ones():
    base = compose_job_config([])
    assert recipe_blocks(base) == {
        "diva", "avspo", "codapo", "durian", "pgpo", "mupo", "noise_contrastive_grpo", "rollout_requests", "launch"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # Hydra's own error would advise "+diva.advantage.kk=0.2", which the trainer refuses 40 s later.
        (
            "diva.advantage.kk=0.2",
            "argument 1 'diva.advantage.kk=0.2': unknown key 'kk' under 'diva.advantage' (did you mean 'k'?); "
            "valid keys: ['batch_norm', 'epsilon', 'global_coef', 'k', 'local_coef', 'reward_max', 'rrb']",
        ),
        ("+diva.advantage.kk=0.2", "'diva.advantage' is a typed block of the recipe, whose keys are fixed"),
        ("+pgpo.tauu=0.5", "unknown key 'tauu' under 'pgpo' (did you mean 'tau'?)"),
        ("trainer.totl_epochs=3", "unknown key 'totl_epochs' under 'trainer' (did you mean 'total_epochs'?)"),
        ("trainer.total_epochs=[3", "argument 1 'trainer.total_epochs=[3' is not a valid Hydra override"),
        ("trainer.total_epochs=abc", "trainer.total_epochs expects a whole number (its default is 5), got the string"),
        ("trainer.total_epochs=2.5", "expects a whole number (its default is 5), got the number 2.5"),
        ("diva.advantage.k=high", "diva.advantage.k expects a number (its default is 0.1), got the string 'high'"),
        ("diva.advantage.rrb=maybe", "diva.advantage.rrb expects true or false"),
        ("diva.variants.noise_sigma=0.3", "diva.variants.noise_sigma expects a list"),
        ("trainer.total_epochs.x=1", "'trainer.total_epochs' is the value 5, not a mapping"),
        ("+trainer.total_epochs=3", "trainer.total_epochs is already in the config; set it without the '+'"),
        ("~trainer.nosuch", "there is no key trainer.nosuch to delete"),
    ],
)
def test_a_bad_override_is_refused_naming_the_argument(override, message):
    with pytest.raises(ConfigError) as err:
        compose_job_config([override])
    assert message in str(err.value)
    assert "To append to your config use +" not in str(err.value)


def test_the_argument_is_named_by_its_place():
    with pytest.raises(ConfigError, match=r"^argument 3 'diva.advantage.kk=1'"):
        compose_job_config(["trainer.total_epochs=3", "data.train_batch_size=8", "diva.advantage.kk=1"])


@pytest.mark.parametrize(
    "override",
    [
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=/x/m.jsonl",  # verl's open blocks take +
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "+cpu_run.resume_steps=1",  # tiny_cpu.sh's block, popped before verl sees the config
        "data.train_files=[a.parquet,b.parquet]",  # a string default takes a list of files
        "trainer.logger=[console,file]",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "diva.advantage.k=1",  # an integer where a number is expected
        "data.gen_batch_size=16",  # a null default takes any value
        "~trainer.logger",
    ],
)
def test_good_overrides_pass(override):
    compose_job_config([override])


def _launch(tmp_path, *args, **env):
    run_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN", "DIVA_PRINT_ONLY")}
    # TMPDIR: this test's own, where a Ray head's temp folder would be made (other runs on the machine make theirs
    # in /tmp meanwhile).
    run_env.update(CKPT_DIR=str(tmp_path / "ckpt"), TMPDIR=str(tmp_path), **env)
    started = time.monotonic()
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh", *args], cwd=ROOT, env=run_env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    print(f"refused in {elapsed:.1f} s: {' '.join(args) or env}")
    assert not glob.glob(str(tmp_path / "diva_ray_*"))  # no Ray head's temp folder (in TMPDIR) was ever made
    return out, elapsed


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["diva.advantage.kk=0.2"], {}, "unknown key 'kk' under 'diva.advantage' (did you mean 'k'?)"),
        (["+diva.advantage.kk=0.2"], {}, "unknown key 'kk' under 'diva.advantage'"),
        (["trainer.total_epochs=[3"], {}, "'trainer.total_epochs=[3' is not a valid Hydra override"),
        (["trainer.total_epochs=abc"], {}, "trainer.total_epochs expects a whole number"),
        ([], {"QUESTIONS_PER_STEP": "abc"}, "error: QUESTIONS_PER_STEP=abc: expected a whole number"),
        ([], {"LR": "fast"}, "error: LR=fast: expected a number"),
    ],
)
def test_the_launcher_refuses_in_seconds_before_ray(tmp_path, args, env, message):
    out, elapsed = _launch(tmp_path, *args, DRY_RUN="1", **env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "To append to your config" not in out.stderr
    assert "starting a local Ray head" not in out.stdout and "unbound variable" not in out.stderr
    assert elapsed < 30, elapsed  # about 2 s alone (CI runs another test process beside); no Ray start-up


def test_a_method_launchers_own_variable_is_refused_by_the_config_check(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN", "DIVA_PRINT_ONLY")}
    env.update(CKPT_DIR=str(tmp_path / "ckpt"), DRY_RUN="1", NOISE_SCALE="loud")
    started = time.monotonic()
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_noise_contrastive_grpo.sh"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and time.monotonic() - started < 30  # about 2 s alone; no Ray start-up
    expected = "noise_contrastive_grpo.noise_scale expects a number (its default is 2.0), got the string 'loud'"
    assert expected in out.stderr
    assert "refused in" in out.stderr and "before any Ray process started" in out.stderr
