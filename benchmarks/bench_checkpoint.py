"""What the reshardable checkpoint copy (verl_ext.checkpoint) costs next to verl's own per-rank format.

Two ranks on one gloo group (the CPU runs' setup), each model sharded by FSDP2 ``fully_shard`` (each layer of its
``_no_split_modules``, then the root) with AdamW state from two training steps and verl's cosine schedule, checkpointed
by :class:`~verl_ext.checkpoint.reshardable.ReshardableCheckpointManager`. Measured for each model:

* save time: verl's per-rank files (verl's ``FSDPCheckpointManager.save_checkpoint``) vs. the DCP copy
  (``save_reshardable_copy``), and the save with both, as the manager does it, over verl's alone;
* load time at the same world size: verl's load vs. the DCP copy's (``load_reshardable_copy``);
* load time of a resharded load: the two-rank DCP copy loaded by one process (2 -> 1), which verl cannot do;
* bytes on disk: verl's ``model_/optim_/extra_state_world_size_2_rank_*.pt`` vs. the ``dcp/`` folder.

Models: the tiny Qwen2.5-VL of :mod:`verl_ext.cpu.tiny_model` (the CPU runs' model) and a synthetic Llama of ~60M
parameters (vocabulary 32,000, hidden 512, 8 layers) so that the sizes mean something. Times are medians over the
rounds, verl's format and the copy interleaved round by round (``benchmarks/timing.py``), rank 0's clock (every
call ends in a barrier); the loads read files just written, from the page cache: they measure serialization and
resharding, not the disk. One thread per rank.

    python benchmarks/bench_checkpoint.py            # 5 rounds
    python benchmarks/bench_checkpoint.py --quick    # 2 rounds

Prints ratios side by side; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from record import add_no_record, record
from timing import time_round_robin

MODELS = ("tiny_qwen2_5_vl", "llama_60m")
SAVE_RANKS = 2
SEED = 0


def _synthetic_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def _build(name: str, model_dir: str, world_size: int):
    """The sharded model, AdamW with two steps of state, verl's cosine schedule, and the manager."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.utils import logging as transformers_logging
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    from verl_ext.checkpoint.reshardable import ReshardableCheckpointManager

    transformers_logging.disable_progress_bar()  # one "Loading weights" bar per rank would cut into the table
    torch.manual_seed(SEED)
    if name == "tiny_qwen2_5_vl":
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    else:
        model = _synthetic_llama()
    mesh = init_device_mesh("cpu", (world_size,))
    layer_classes = set(model._no_split_modules or [])
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=100)
    vocab = model.config.get_text_config().vocab_size
    for step in range(2):  # text-only batches: AdamW's moments exist for every parameter that gets a gradient
        batch = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(step))
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    manager = ReshardableCheckpointManager(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, processing_class=None, checkpoint_config=None
    )
    return model, manager


def _folder_bytes(folder: str, keep=lambda name: True) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names if keep(name)
    )


def _measure_saved(manager, model, verl_dir: str, copy_dir: str, rounds: int) -> dict:
    """At two ranks: both formats saved and loaded, interleaved; their bytes on disk."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    times = time_round_robin(
        {
            "verl_save": lambda: FSDPCheckpointManager.save_checkpoint(manager, verl_dir),
            "dcp_save": lambda: manager.save_reshardable_copy(copy_dir),
        },
        rounds,
    )
    times |= time_round_robin(
        {
            "verl_load": lambda: FSDPCheckpointManager.load_checkpoint(manager, verl_dir),
            "dcp_load": lambda: manager.load_reshardable_copy(copy_dir),
        },
        rounds,
    )
    return {
        "params": sum(p.numel() for p in model.parameters()),
        **times,
        "verl_bytes": _folder_bytes(verl_dir, lambda f: f"_world_size_{SAVE_RANKS}_rank_" in f),
        "dcp_bytes": _folder_bytes(os.path.join(copy_dir, "dcp")),
    }


def _measure_resharded(manager, copy_dir: str, rounds: int) -> dict:
    """At one rank: the two-rank copy loaded (verl's files cannot be)."""
    return time_round_robin({"resharded_load": lambda: manager.load_reshardable_copy(copy_dir)}, rounds)


def _rank_main(rank: int, world_size: int, port: int, workdir: str, rounds: int) -> None:
    """One rank: at two ranks, save and load both formats; at one, the resharded load of the two-rank copy."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    figures = {}
    for name in MODELS:
        model, manager = _build(name, os.path.join(workdir, "tiny_qwen2_5_vl"), world_size)
        verl_dir, copy_dir = (os.path.join(workdir, name, kind, "actor") for kind in ("verl", "reshardable"))
        if world_size == SAVE_RANKS:
            figures[name] = _measure_saved(manager, model, verl_dir, copy_dir, rounds)
        else:
            figures[name] = _measure_resharded(manager, copy_dir, rounds)
        del model, manager
    if rank == 0:
        with open(os.path.join(workdir, f"figures_world_size_{world_size}.json"), "w") as f:
            json.dump(figures, f)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one untimed)")
    parser.add_argument("--workdir", default=None, help="folder for the model and checkpoints (default: a temp one)")
    add_no_record(parser)
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds

    from verl_ext.cpu.tiny_model import build_tiny_vlm

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_checkpoint_")
    try:
        build_tiny_vlm(os.path.join(workdir, "tiny_qwen2_5_vl"), seed=SEED)
        for world_size in (SAVE_RANKS, 1):  # the one-rank load reads the two-rank run's copy
            mp.spawn(_rank_main, args=(world_size, _free_port(), workdir, rounds), nprocs=world_size, join=True)
        with open(os.path.join(workdir, f"figures_world_size_{SAVE_RANKS}.json")) as f:
            saved = json.load(f)
        with open(os.path.join(workdir, "figures_world_size_1.json")) as f:
            resharded = json.load(f)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    result = {"benchmark": "checkpoint", "quick": args.quick, "rounds": rounds, "save_ranks": SAVE_RANKS}
    print(
        "[bench] model             params   save ms verl | dcp (dcp/verl, both/verl)   "
        "load ms verl | dcp (ratio)   2->1 ms (/verl load)   MB verl | dcp (ratio)"
    )
    for name in MODELS:
        s = saved[name]
        f = {
            "params": s["params"],
            "verl_save_ms": round(s["verl_save"], 1),
            "dcp_save_ms": round(s["dcp_save"], 1),
            "save_ratio_dcp_over_verl": round(s["dcp_save"] / s["verl_save"], 3),
            "save_ratio_both_over_verl": round((s["verl_save"] + s["dcp_save"]) / s["verl_save"], 3),
            "verl_load_ms": round(s["verl_load"], 1),
            "dcp_load_ms": round(s["dcp_load"], 1),
            "load_ratio_dcp_over_verl": round(s["dcp_load"] / s["verl_load"], 3),
            "resharded_load_2_to_1_ms": round(resharded[name]["resharded_load"], 1),
            "resharded_load_over_verl_load": round(resharded[name]["resharded_load"] / s["verl_load"], 3),
            "verl_bytes": s["verl_bytes"],
            "dcp_bytes": s["dcp_bytes"],
            "bytes_ratio_dcp_over_verl": round(s["dcp_bytes"] / s["verl_bytes"], 3),
        }
        result[name] = f
        print(
            f"[bench] {name:16s} {f['params'] / 1e6:6.1f}M   {f['verl_save_ms']:7.1f} | {f['dcp_save_ms']:7.1f} "
            f"({f['save_ratio_dcp_over_verl']:.2f}x, {f['save_ratio_both_over_verl']:.2f}x)   "
            f"{f['verl_load_ms']:7.1f} | {f['dcp_load_ms']:7.1f} ({f['load_ratio_dcp_over_verl']:.2f}x)   "
            f"{f['resharded_load_2_to_1_ms']:7.1f} ({f['resharded_load_over_verl_load']:.2f}x)   "
            f"{f['verl_bytes'] / 2**20:7.1f} | {f['dcp_bytes'] / 2**20:7.1f} ({f['bytes_ratio_dcp_over_verl']:.3f}x)",
            flush=True,
        )
    if not args.no_record:
        record("checkpoint_quick" if args.quick else "checkpoint", result, argv)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
