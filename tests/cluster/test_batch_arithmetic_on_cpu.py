"""Per-rank batch arithmetic, checked before a model loads, against what verl itself does with the same step.

The reference runs verl 0.9.1's own code on a stand-in batch of the real shape: ``_get_required_batch_multiple`` (an
unbound call on the composed config), the padding arithmetic of ``upsample_batch_to_divisible_size``, then on one
rank's rows ``prepare_micro_batches`` (old and reference log-probs) and ``train_mini_batch``'s split (its mini-batch
assertion, ``make_iterator``, then ``prepare_micro_batches`` per mini-batch). A configuration passes the check
exactly when none of those asserts.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from recipe.diva_grpo.prelaunch import launch_config
from verl_ext.cluster.batch_arithmetic import READ_KEYS, BatchArithmeticError, batch_plan, check_batch_arithmetic

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "diva_grpo" / "config"
_AR = "actor_rollout_ref"


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("diva_grpo", overrides=overrides)


def _rank_rows(rows: int) -> TensorDict:
    return TensorDict({"x": torch.zeros(rows, 1)}, batch_size=[rows])


def _micro_batches(rows: int, micro: int) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    data = _rank_rows(rows)
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro)
    prepare_micro_batches(data)


def verl_accepts(cfg) -> bool:
    """Whether verl's own code, run on a batch of ``cfg``'s shape, gets through a step without asserting."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import tensordict_utils as tu

    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    dp = world // cfg[_AR].actor.ulysses_sequence_parallel_size
    responses = cfg.data.train_batch_size * cfg[_AR].rollout.n
    try:
        # validate_config's batch rule (FSDP: the minimal batch is the GPU count)
        assert responses % world == 0
        trainer = SimpleNamespace(config=cfg, use_critic=False, global_steps=1)
        multiple = PPOTrainer._get_required_batch_multiple(trainer, dp)
        padded = responses + (-responses) % multiple  # upsample_batch_to_divisible_size
        rows = padded // dp
        _micro_batches(rows, cfg[_AR].rollout.log_prob_micro_batch_size_per_gpu)
        mini = cfg[_AR].actor.ppo_mini_batch_size * cfg[_AR].rollout.n
        assert mini % dp == 0  # train_mini_batch
        for part in tu.make_iterator(_rank_rows(rows), mini_batch_size=mini // dp, epochs=1):
            _micro_batches(len(part), cfg[_AR].actor.ppo_micro_batch_size_per_gpu)
    except AssertionError:
        return False
    return True


def _step_settings(cfg):
    """The keys a step's arithmetic reads (and verl's ``critic_warmup``), from a composed config, in a small config
    that a grid can change in place (merging whole composed configs costs ~0.1 s each)."""
    small = OmegaConf.create({})
    for key in (*READ_KEYS, "trainer.critic_warmup"):
        OmegaConf.update(small, key, OmegaConf.select(cfg, key), force_add=True)
    return small


GRID = {
    "trainer.nnodes": (1, 2, 3),
    "trainer.n_gpus_per_node": (1, 2, 4),
    "data.train_batch_size": (2, 3, 4, 6),
    f"{_AR}.rollout.n": (2, 5),
    f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu": (1, 3, 4),
    f"{_AR}.actor.ppo_micro_batch_size_per_gpu": (1, 2, 4),
}


def test_the_check_refuses_exactly_what_verl_asserts_on():
    cfg = _step_settings(_compose([]))
    checked = refused = 0
    for values in itertools.product(*GRID.values()):
        settings = dict(zip(GRID, values, strict=True))
        for key, value in settings.items():
            OmegaConf.update(cfg, key, value)
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = cfg.data.train_batch_size
        try:
            check_batch_arithmetic(cfg)
            ours = True
        except BatchArithmeticError:
            ours = False
        assert ours == verl_accepts(cfg), settings
        checked += 1
        refused += not ours
    assert checked == math.prod(len(v) for v in GRID.values()) and 0 < refused < checked


@pytest.mark.parametrize("nnodes", [1, 2, 4, 8])
def test_the_paper_configuration_on_1_2_4_8_nodes(nnodes):
    """The launcher's own composition (recipe yaml and overrides, verl not loaded): 128 prompts x 5 responses on 8 GPUs
    per node. 80, 40 and 20 rows per rank divide by the log-prob micro-batch of 4; 10 rows on 64 GPUs do not."""
    cfg = launch_config([f"trainer.nnodes={nnodes}"])
    if nnodes < 8:
        plan = check_batch_arithmetic(cfg)
        assert plan.rows_per_rank == 640 // (8 * nnodes)
        assert verl_accepts(_compose([f"trainer.nnodes={nnodes}"]))
        return
    with pytest.raises(BatchArithmeticError) as refused:
        check_batch_arithmetic(cfg)
    message = str(refused.value)
    assert message.startswith(f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu=4 does not divide the 10 rows")
    assert "to 2 or 5 (divisors of 10)" in message
    assert "trainer.nnodes to 5 or 10" in message
    assert "use_dynamic_bsz=true" in message
    assert not verl_accepts(_compose([f"trainer.nnodes={nnodes}"]))
    # The values it names pass.
    for fix in (f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu=5", "trainer.nnodes=5", "trainer.nnodes=10"):
        check_batch_arithmetic(launch_config([f"trainer.nnodes={nnodes}", fix]))


def test_the_plan_of_each_pass():
    cfg = launch_config(
        [
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            "data.train_batch_size=4",
            f"{_AR}.actor.ppo_mini_batch_size=2",
            f"{_AR}.rollout.n=4",
            f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu=8",
            f"{_AR}.actor.ppo_micro_batch_size_per_gpu=4",
            f"{_AR}.actor.use_kl_loss=true",
            f"{_AR}.ref.log_prob_micro_batch_size_per_gpu=2",
        ]
    )
    plan = batch_plan(cfg)
    assert (plan.world, plan.dp, plan.replicas, plan.responses, plan.padded, plan.rows_per_rank) == (2, 2, 2, 16, 16, 8)
    rows = {p.name: (p.rows, p.micro_batch) for p in plan.passes}
    assert rows == {"old log-probs": (8, 8), "reference log-probs": (8, 2), "actor update": (4, 4)}
    assert plan.lines()[0].startswith("4 prompts x 4 responses = 16 rows over 2 ranks (2 GPUs)")


def test_padding_rows_count_in_every_pass():
    # 3 prompts x 2 responses on 4 GPUs: verl's validate_config refuses 6 rows on 4 GPUs...
    too_few = r"6 responses do not split over 4 GPUs.*nearest data.train_batch_size: 2 or 4"
    with pytest.raises(BatchArithmeticError, match=too_few):
        check_batch_arithmetic(
            launch_config(["trainer.n_gpus_per_node=4", "data.train_batch_size=3", f"{_AR}.rollout.n=2"])
        )
    # ...updates of 3 prompts x 2 responses do not split over 4 ranks; of 2 x 2, 8 responses need no padding; of
    # 8 x 2, verl pads the 8 responses to lcm(4, 16) = 16 rows.
    cfg = launch_config(
        [
            "trainer.n_gpus_per_node=4",
            "data.train_batch_size=4",
            f"{_AR}.rollout.n=2",
            f"{_AR}.actor.ppo_mini_batch_size=3",
            f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu=1",
            f"{_AR}.actor.ppo_micro_batch_size_per_gpu=1",
        ]
    )
    with pytest.raises(BatchArithmeticError, match=r"6 responses per optimizer step do not split over 4 training"):
        batch_plan(cfg)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    plan = batch_plan(cfg)
    assert (plan.padded, plan.rows_per_rank) == (8, 2)
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 8
    plan = batch_plan(cfg)
    assert (plan.padded, plan.rows_per_rank) == (16, 4)  # 8 real responses and 8 no-op rows


def test_method_passes_and_dynamic_batch_size():
    pgpo = batch_plan(launch_config(["algorithm.adv_estimator=pgpo"]))
    assert [p.name for p in pgpo.passes] == ["old log-probs", "PGPO blind pass", "actor update"]
    codapo = batch_plan(launch_config(["algorithm.adv_estimator=codapo"]))
    assert "CoDaPO resampled pass" in [p.name for p in codapo.passes]
    dynamic = check_batch_arithmetic(launch_config(["trainer.nnodes=8", f"{_AR}.actor.use_dynamic_bsz=true"]))
    assert all(p.micro_batch is None for p in dynamic.passes)
    assert "dynamic batch size" in "\n".join(dynamic.lines())


def test_sequence_and_rollout_parallel_sizes_must_divide_the_world():
    with pytest.raises(BatchArithmeticError, match=re.escape("tensor_model_parallel_size: 2 or 4")):
        batch_plan(launch_config(["trainer.n_gpus_per_node=4", f"{_AR}.rollout.tensor_model_parallel_size=3"]))
    cfg = launch_config(["trainer.n_gpus_per_node=4", f"{_AR}.actor.ulysses_sequence_parallel_size=2"])
    assert batch_plan(cfg).dp == 2 and math.prod([batch_plan(cfg).replicas]) == 4
