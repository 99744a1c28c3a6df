"""The blind pass through verl's real actor worker group on the CPU (run in its own process by the test).

``python tests/pgpo/blind_worker_run.py WORKDIR`` builds the tiny local Qwen2-VL of :mod:`verl_ext.cpu.tiny_model`
(tokenizer and processor included), starts Ray and TransferQueue, spawns verl's ``RayWorkerGroup`` of
:class:`verl_ext.pgpo.worker.PgpoActorRolloutRefWorker` (role ``actor``: FSDP2 engine on the CPU platform of
:mod:`verl_ext.cpu`, the recipe's config with the CPU overrides), puts four trajectories in TransferQueue as verl's
agent loop does (processor-made prompts, the two with an image first, so that the sighted pass has a micro-batch
without pixels), runs verl's sighted ``compute_log_prob`` and writes
``old_log_probs`` as ``_compute_old_log_prob`` does, then calls :func:`verl_ext.pgpo.compute_blind_log_probs` with
the worker group. Prints, as its last line, one JSON object: per trajectory the largest difference of the stored
``blind_log_probs`` to a plain transformers forward of the sequence without its visual tokens (positions kept) and
to the sighted ``old_log_probs``, and the hook's metrics.
"""

from __future__ import annotations

import json
import os
import sys

from verl_ext.cpu import CPU_ENV

os.environ.update(CPU_ENV)
# tests/ on the path for the shared trajectory builder (run as a script, this file's own folder is on it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agent_loop_rows import trajectory  # noqa: E402

RECIPE_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "recipe", "diva_grpo", "config")


def main(workdir: str) -> None:
    from types import SimpleNamespace

    import numpy as np
    import ray
    import torch
    import transfer_queue as tq
    from hydra import compose, initialize_config_dir
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray.base import create_colocated_worker_cls
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.workers.utils.padding import response_from_nested

    from verl_ext.cpu.overrides import cpu_overrides
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl
    from verl_ext.pgpo import compute_blind_log_probs
    from verl_ext.pgpo.worker import PgpoActorRolloutRefWorker

    paths = {"model": os.path.join(workdir, "tiny_qwen2_vl"), "train": "unused.parquet", "val": "unused.parquet"}
    build_tiny_qwen2_vl(paths["model"])
    overrides = cpu_overrides(paths, os.path.join(workdir, "ckpt"), ray_init=False)
    overrides.append("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2")
    with initialize_config_dir(config_dir=os.path.abspath(RECIPE_CONFIG), version_base=None):
        config = compose("diva_grpo", overrides=overrides)

    ray.init(num_cpus=16, num_gpus=1, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": CPU_ENV})
    tq.init(config.transfer_queue)
    try:
        pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=3, name_prefix="pgpo")
        actor = RayClassWithInitArgs(
            cls=ray.remote(PgpoActorRolloutRefWorker), config=config.actor_rollout_ref, role="actor"
        )
        group = RayWorkerGroup(
            resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls({"actor": actor}), device_name="cpu"
        )
        worker_group = group.spawn(prefix_set={"actor"})["actor"]
        worker_group.init_model()

        processor = AutoProcessor.from_pretrained(paths["model"])
        model = AutoModelForImageTextToText.from_pretrained(paths["model"], dtype=torch.float32).eval()
        rng = np.random.default_rng(0)
        # Image rows first: verl's sighted pass (micro-batches of 2, in order) then gets a micro-batch without
        # pixels, which verl's Qwen2-VL forward takes only through verl_ext/no_pixels_patch.py: the plugin must have
        # applied it in this worker process before any blind pass.
        rows = [
            trajectory(processor, model, rng, True, "what is 2+2?", "4, it is"),
            trajectory(processor, model, rng, True, "count", "three"),
            trajectory(processor, model, rng, False, "say hi", "hi there"),
            trajectory(processor, model, rng, False, "no image here, and a longer prompt", "ok"),
        ]
        keys = [f"pgpo{i}_0_0" for i in range(len(rows))]
        tags = [{"status": "success", "seq_len": int(row["input_ids"].numel())} for row in rows]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")

        # verl's _compute_old_log_prob: the sighted pass, then old_log_probs in response layout.
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False, "temperature": 1.0})
        worker_group.compute_log_prob(batch)
        sighted = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["log_probs", "response_mask"])
        old = response_from_nested(sighted["log_probs"], sighted["response_mask"])
        tq.kv_batch_put(
            keys=keys, partition_id="train", fields=TensorDict({"old_log_probs": old}, batch_size=[len(keys)])
        )

        metrics: dict = {}
        trainer = SimpleNamespace(processor=processor, actor_rollout_wg=worker_group, config=config)
        returned = compute_blind_log_probs(trainer, batch, metrics)
        blind = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["blind_log_probs"])["blind_log_probs"]

        report = {"returned_same_batch": returned is batch, "metrics": metrics, "rows": []}
        for i, row in enumerate(rows):
            ids, positions = row["input_ids"], row["position_ids"]
            keep = ids != model.config.image_token_id
            kept = positions[:, keep].clone()
            kept[0] = torch.arange(kept.shape[1])
            with torch.no_grad():
                logits = model(input_ids=ids[keep].unsqueeze(0), position_ids=kept.unsqueeze(1), use_cache=False)
            labels = torch.roll(ids[keep], -1)
            by_hand = torch.log_softmax(logits.logits[0].float(), -1).gather(-1, labels[:, None])[:, 0]
            by_hand = by_hand[-len(row["responses"]) - 1 : -1]
            report["rows"].append(
                {
                    "image": bool((~keep).any()),
                    "blind_vs_by_hand": float((blind[i] - by_hand).abs().max()),
                    "blind_vs_sighted": float((blind[i] - old[i]).abs().max()),
                }
            )
        print(json.dumps(report))
    finally:
        tq.close()
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
