"""The toolkit methods' launchers: each composes its paper's run on the toolkit trainer, fails fast on a CPU machine
naming its own preflight, and its DRY_RUN=1 preflight passes (run in this process on the launcher's overrides;
test_launchers_on_cpu.py runs DIVA's through `ray job submit`)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import ray
from test_launchers_on_cpu import ROOT, compose_overrides, has_gpu, launcher_overrides

# method -> (rollouts per prompt, prompts per step) of its launcher.
LAUNCHERS = {
    "avspo": (8, 128),
    "codapo": (8, 128),
    "durian": (8, 128),
    "mupo": (15, 128),
    "noise_contrastive_grpo": (8, 128),
    "pgpo": (5, 128),
}
# The GRPO baseline's launcher runs on the toolkit trainer too (tests/recipe/test_launchers_on_cpu.py composes it).
TOOLKIT_LAUNCHERS = sorted([*LAUNCHERS, "grpo"])
PIXEL_LIMITED = ("pkg://verl_ext.data.pixel_limit", "PixelLimitedDataset")


@pytest.mark.parametrize("method", sorted(LAUNCHERS))
def test_method_launcher_composes_the_toolkit_run(method):
    n, prompts = LAUNCHERS[method]
    cfg = compose_overrides(launcher_overrides(f"run_scripts/qwen25vl7b_{method}.sh"))
    assert cfg.algorithm.adv_estimator == method
    assert cfg.trainer.v1.trainer_mode == "toolkit"
    # verl's own dataset on the DIVA parquet, no variants, the images limited as DIVA's are (MAX_PIXELS)
    assert (cfg.data.custom_cls.path, cfg.data.custom_cls.name) == PIXEL_LIMITED
    assert cfg.actor_rollout_ref.rollout.n == n
    assert cfg.data.train_batch_size == prompts == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert cfg.trainer.experiment_name == f"qwen25vl7b_{method}"
    assert method in cfg  # the method's knob block


def test_pgpo_launcher_uses_the_papers_dapo_recipe():
    cfg = compose_overrides(launcher_overrides("run_scripts/qwen25vl7b_pgpo.sh"))
    assert cfg.data.max_response_length == 2048
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert not cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
@pytest.mark.parametrize("method", TOOLKIT_LAUNCHERS)
def test_method_launcher_fails_fast_without_gpus_naming_its_preflight(method):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN")}
    started = time.monotonic()
    out = subprocess.run(
        ["bash", f"run_scripts/qwen25vl7b_{method}.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert f"DRY_RUN=1 bash run_scripts/qwen25vl7b_{method}.sh" in out.stderr
    assert time.monotonic() - started < 60


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=16, include_dashboard=False, namespace="test_method_launchers", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.launch  # a Ray cluster and each method's preflight: the launch tier
@pytest.mark.parametrize("method", TOOLKIT_LAUNCHERS)
def test_method_preflight_passes(method, local_ray, tmp_path, monkeypatch, capsys):
    from recipe.diva_grpo.preflight import run_preflight

    monkeypatch.setenv("DIVA_PREFLIGHT_DIR", str(tmp_path))
    for name in ("TRAIN_FILES", "VAL_FILES", "MUPO_EMBEDDING_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    named = {}
    if method == "grpo":
        from data_prep.synth import synth

        train, val = tmp_path / "mine_train.parquet", tmp_path / "mine_val.parquet"
        synth(str(train), 16, seed=0, split="train")
        synth(str(val), 4, seed=1, split="test")
        named = {"TRAIN_FILES": str(train), "VAL_FILES": str(val)}
    cfg = compose_overrides(launcher_overrides(f"run_scripts/qwen25vl7b_{method}.sh", DRY_RUN="1", **named))
    summary = run_preflight(cfg)
    assert summary["steps"] == [1, 2, 3] and summary["method"] == method
    assert any(key.startswith(f"{method}/collapse_rate") for key in summary)
    if method == "noise_contrastive_grpo":
        # The simulated rollouts carry the flags of NC-GRPO's own agent loop code: half of each group, every step.
        import json

        logged = [
            json.loads(line)["data"]
            for path in tmp_path.glob("*/*.jsonl")
            for line in path.read_text().splitlines()
            if "noise_contrastive_grpo/advantage/mean" in line
        ]
        assert len(logged) == 3 and all(entry[f"{method}/noisy_fraction"] == 0.5 for entry in logged)
    out = capsys.readouterr().out
    if method == "grpo":  # on the user's files: the ones named, said so
        assert f"PASSED on your data (train {train}; val {val}): config, data, reward, grpo steps" in out
        assert "synthetic" not in out
    else:
        assert f"PASSED on a synthetic set (no data named: not your data): config, data, reward, {method} steps" in out
