"""Shared setup of the toolkit trainer's CPU tests: the recipe config for one method on verl's plain dataset,
synthetic data, and the metrics file verl's file logger writes."""

from __future__ import annotations

import json
import os

from hydra import compose, initialize_config_dir

from data_prep.synth import synth

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "recipe", "diva_grpo", "config")


def compose_toolkit_config(tmp_path, method: str, *overrides, prompts_per_step: int = 4, rollout_n: int = 3):
    """The recipe yaml with ``algorithm.adv_estimator=method`` on the toolkit trainer, sized for a CPU test."""
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose(
            "diva_grpo",
            overrides=[
                f"algorithm.adv_estimator={method}",
                "trainer.v1.trainer_mode=toolkit",
                "data.custom_cls.path=null",
                "data.custom_cls.name=null",
                "diva.variants.variants_per_question=0",
                f"data.train_files={tmp_path}/train.parquet",
                f"data.val_files={tmp_path}/val.parquet",
                f"data.train_batch_size={prompts_per_step}",
                "data.dataloader_num_workers=0",
                "data.filter_overlong_prompts=false",
                f"actor_rollout_ref.rollout.n={rollout_n}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_per_step}",
                "trainer.total_training_steps=3",
                "trainer.save_freq=2",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                f"trainer.default_local_dir={tmp_path}/ckpt",
                "trainer.logger=[file]",
                f"trainer.experiment_name=test_{method}",
                "transfer_queue.enable=true",
                *overrides,
            ],
        )


def write_synth_data(tmp_path, questions: int = 12) -> None:
    synth(tmp_path / "train.parquet", questions, seed=0, split="train")
    synth(tmp_path / "val.parquet", 4, seed=1, split="test")


def read_metrics(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def real_rows(update) -> list[int]:
    """Indices of an update's rows that are not verl's synthetic padding rows, in key order: the order the toolkit's
    advantage step hands them to the method, whatever order verl's balancing left (MUPO's k-means depends on it)."""
    from verl_ext.rollout.replay_buffer import key_order

    rows = [i for i, tag in enumerate(update["tags"]) if not tag.get("is_padding", False)]
    return sorted(rows, key=lambda i: key_order(update["keys"][i]))
