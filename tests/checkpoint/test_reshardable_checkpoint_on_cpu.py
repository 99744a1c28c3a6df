"""A checkpoint of verl's FSDP2 actor saved at one world size resumes at another (verl_ext.checkpoint).

Real objects throughout: ranks spawned with ``torch.multiprocessing`` on one gloo group (as the project's CPU runs), a
small Llama whose parameter shapes mostly do not split evenly over two ranks (vocabulary 53, hidden 15, MLP 27), plus a
layer outside the forward (never a gradient, so no AdamW state: a VLM's vision tower after text-only steps), sharded by
FSDP2's ``fully_shard``, AdamW with verl's cosine warm-up schedule, and the manager built as verl's FSDP engine builds
it (no tokenizer: verl accepts ``processing_class=None``). Each load is compared with a slow obvious reference, the
saving run's full (unsharded) parameters, AdamW's ``exp_avg`` / ``exp_avg_sq`` / ``step``, learning rate and scheduler
state, gathered with ``full_tensor()`` just before the save. Then both take one more optimizer step on the same batch,
compared exactly: every rank trains on the whole batch, so the ranks' gradients are equal and their average over two
ranks is exact (sum and halving of equal floats), and every process runs on one thread; the two world sizes therefore
add in the same order.

Three spawned sessions, ~40 s on two cores: two ranks (save; verl's own load at the same world size), one rank (load of
the two-rank checkpoint; a save of its own; the refusals; a model-only save; a save before the first step), two ranks
(load of the one-rank checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl_ext.checkpoint.reshardable import (
    DONE_MARKER,
    ReshardableCheckpointManager,
    has_reshardable_checkpoint,
    reshardable_checkpoint_dir,
    saved_world_sizes,
)

# Starts a process group and fresh interpreters that import verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

VOCAB = 53
SAVED_AT_STEP = 2
RESHARD_LOG = "resharded the actor's checkpoint from world size {} to {}"


# ---------------------------------------------------------------- in the spawned ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(task, world_size: int, *args) -> None:
    mp.spawn(_rank_main, args=(world_size, _free_port(), task, args), nprocs=world_size, join=True)


def _rank_main(rank: int, world_size: int, port: int, task, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # same summation order in every process, whatever the world size
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        task(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def _build(world_size: int, seed: int, checkpoint_config=None):
    """Model, optimizer, scheduler and checkpoint manager, as verl's FSDP engine builds them (one mesh, each decoder
    layer and then the root sharded); ``seed`` sets the initial weights."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=15,
        intermediate_size=27,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=6,  # even: rotary embeddings halve it
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Outside the forward: never a gradient, so never AdamW state, like a VLM's vision tower after text-only steps.
    model.never_used = torch.nn.Linear(15, 7)
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=10)
    manager = ReshardableCheckpointManager(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        processing_class=None,
        checkpoint_config=checkpoint_config,
    )
    return model, optimizer, scheduler, manager


def _train_step(model, optimizer, scheduler, step: int) -> None:
    """One step on batch ``step`` (seeded by it); every rank sees the whole batch (see the module)."""
    batch = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(100 + step))
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def _full_state(model, optimizer, scheduler) -> dict:
    """The reference: full parameters and AdamW state per parameter name, learning rates, scheduler state
    (collective: ``full_tensor()`` all-gathers)."""
    params, moments = {}, {}
    for name, param in model.named_parameters():
        params[name] = param.full_tensor().detach().clone()
        state = optimizer.state.get(param)  # not [param]: the defaultdict would add an empty state
        if state is None:
            moments[name] = None
            continue
        moments[name] = {
            "exp_avg": state["exp_avg"].full_tensor().clone(),
            "exp_avg_sq": state["exp_avg_sq"].full_tensor().clone(),
            "step": state["step"].clone(),
        }
    return {
        "params": params,
        "optimizer": moments,
        "lr": [group["lr"] for group in optimizer.param_groups],
        "scheduler": scheduler.state_dict(),
    }


def _full_params(model) -> dict:
    return {name: param.full_tensor().detach().clone() for name, param in model.named_parameters()}


class _Lines(logging.Handler):
    """The reshardable manager's log lines in this process."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        logger = logging.getLogger("verl_ext.checkpoint.reshardable")
        logger.setLevel(logging.INFO)  # whatever VERL_LOGGING_LEVEL the environment sets
        logger.addHandler(self)

    def emit(self, record):
        self.lines.append(record.getMessage())


def _train_and_save(world_size: int, checkpoint: str) -> dict:
    """Train two steps, save, take one more step: the saved state and the next step's parameters."""
    model, optimizer, scheduler, manager = _build(world_size, seed=0)
    for step in range(SAVED_AT_STEP):
        _train_step(model, optimizer, scheduler, step)
    saved = _full_state(model, optimizer, scheduler)
    manager.save_checkpoint(checkpoint, global_step=SAVED_AT_STEP)
    _train_step(model, optimizer, scheduler, SAVED_AT_STEP)
    return {"saved": saved, "next": _full_params(model)}


def _load(world_size: int, checkpoint: str, step_after: bool = True) -> dict:
    """A fresh model (other initial weights) loads ``checkpoint``: its state, the next step's parameters, the log."""
    lines = _Lines()
    model, optimizer, scheduler, manager = _build(world_size, seed=1)
    manager.load_checkpoint(checkpoint)
    loaded = {"loaded": _full_state(model, optimizer, scheduler), "log": lines.lines}
    if step_after:
        _train_step(model, optimizer, scheduler, SAVED_AT_STEP)
        loaded["next"] = _full_params(model)
    return loaded


def _refusal(world_size: int, checkpoint: str) -> dict:
    """The error a fresh model's load of ``checkpoint`` raises, and whether its parameters stayed untouched."""
    model, _, _, manager = _build(world_size, seed=1)
    before = _full_params(model)
    try:
        manager.load_checkpoint(checkpoint)
    except FileNotFoundError as error:
        after = _full_params(model)
        return {"error": str(error), "untouched": all(torch.equal(before[n], after[n]) for n in before)}
    return {"error": None}


def _session_two_ranks_save(rank: int, world_size: int, out: str) -> None:
    """Save at 2; load it at 2 through verl's own files, with the reshardable copy there and without it."""
    checkpoint = os.path.join(out, "saved_at_2", "actor")
    results = {"reference": _train_and_save(world_size, checkpoint)}
    results["verl_path"] = _load(world_size, checkpoint, step_after=False)
    copy, aside = reshardable_checkpoint_dir(checkpoint), checkpoint + "_copy_aside"
    if rank == 0:
        os.rename(copy, aside)
    dist.barrier()
    results["verl_path_without_copy"] = _load(world_size, checkpoint, step_after=False)
    dist.barrier()
    if rank == 0:
        os.rename(aside, copy)
        torch.save(results, os.path.join(out, "two_ranks_save.pt"))


def _session_one_rank(rank: int, world_size: int, out: str) -> None:
    """Load the two-rank checkpoint at 1; save at 1; the refusals; a model-only save."""
    saved_at_2 = os.path.join(out, "saved_at_2", "actor")
    results = {"resharded": _load(world_size, saved_at_2)}
    results["reference"] = _train_and_save(world_size, os.path.join(out, "saved_at_1", "actor"))

    verl_only = os.path.join(out, "verl_only", "actor")
    shutil.copytree(saved_at_2, verl_only, ignore=shutil.ignore_patterns("dcp"))
    results["verl_only"] = _refusal(world_size, verl_only)

    # A save interrupted in the reshardable copy (verl's files were written first): the copy's files are there,
    # one of them cut short, and rank 0 never wrote done.json.
    interrupted = os.path.join(out, "interrupted", "actor")
    shutil.copytree(saved_at_2, interrupted)
    copy = Path(reshardable_checkpoint_dir(interrupted))
    (copy / DONE_MARKER).unlink()
    shard = copy / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    results["interrupted"] = _refusal(world_size, interrupted)

    *_, manager = _build(world_size, seed=0, checkpoint_config={"save_contents": ["model"]})
    manager.save_checkpoint(os.path.join(out, "model_only", "actor"), global_step=SAVED_AT_STEP)

    # Saved before any optimizer step (the optimizer has no state yet), then loaded through the copy.
    untrained = os.path.join(out, "untrained", "actor")
    model, optimizer, _, manager = _build(world_size, seed=3)
    before = _full_params(model)
    manager.save_checkpoint(untrained, global_step=0)
    results["untrained"] = {"state_after_save": len(optimizer.state)}
    model, optimizer, _, manager = _build(world_size, seed=1)
    manager.load_reshardable_copy(untrained)
    after = _full_params(model)
    results["untrained"]["state_after_load"] = len(optimizer.state)
    results["untrained"]["params_equal"] = all(torch.equal(before[n], after[n]) for n in before)
    torch.save(results, os.path.join(out, "one_rank.pt"))


def _session_two_ranks_load(rank: int, world_size: int, out: str) -> None:
    """Load the one-rank checkpoint at 2."""
    results = {"resharded": _load(world_size, os.path.join(out, "saved_at_1", "actor"))}
    if rank == 0:
        torch.save(results, os.path.join(out, "two_ranks_load.pt"))


# ---------------------------------------------------------------- in pytest


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> dict:
    """Run the three sessions in order (each needs the one before's checkpoint); their results."""
    out = str(tmp_path_factory.mktemp("reshardable"))
    _spawn(_session_two_ranks_save, 2, out)
    _spawn(_session_one_rank, 1, out)
    _spawn(_session_two_ranks_load, 2, out)
    results = {name: torch.load(os.path.join(out, f"{name}.pt")) for name in ("two_ranks_save", "one_rank")}
    results["two_ranks_load"] = torch.load(os.path.join(out, "two_ranks_load.pt"))
    results["out"] = Path(out)
    return results


def assert_same_state(loaded: dict, reference: dict) -> None:
    assert loaded["params"].keys() == reference["params"].keys()
    for name, param in reference["params"].items():
        assert torch.equal(loaded["params"][name], param), name
        if reference["optimizer"][name] is None:  # never had a gradient: no state, in either run
            assert loaded["optimizer"][name] is None, name
            continue
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded["optimizer"][name][key], reference["optimizer"][name][key]), (name, key)
    assert loaded["lr"] == reference["lr"]
    assert loaded["scheduler"] == reference["scheduler"]
    assert reference["scheduler"]["last_epoch"] == SAVED_AT_STEP
    steps = [float(state["step"]) for state in loaded["optimizer"].values() if state is not None]
    assert steps and all(step == SAVED_AT_STEP for step in steps)
    assert loaded["optimizer"]["never_used.weight"] is None


def assert_same_params(params: dict, reference: dict) -> None:
    assert params.keys() == reference.keys()
    for name, param in reference.items():
        assert torch.equal(params[name], param), name


def test_saved_at_2_loads_at_1(sessions):
    reference, resharded = sessions["two_ranks_save"]["reference"], sessions["one_rank"]["resharded"]
    assert_same_state(resharded["loaded"], reference["saved"])
    assert_same_params(resharded["next"], reference["next"])
    assert RESHARD_LOG.format(2, 1) in "\n".join(resharded["log"])
    # The parameter shapes split unevenly over two ranks (FSDP2 pads the last shard): the test's point.
    assert any(p.shape[0] % 2 for p in reference["saved"]["params"].values())


def test_saved_at_1_loads_at_2(sessions):
    reference, resharded = sessions["one_rank"]["reference"], sessions["two_ranks_load"]["resharded"]
    assert_same_state(resharded["loaded"], reference["saved"])
    assert_same_params(resharded["next"], reference["next"])
    assert RESHARD_LOG.format(1, 2) in "\n".join(resharded["log"])


def test_saved_at_2_loads_at_2_through_verls_own_files(sessions):
    """Same world size: verl's load, unchanged (no reshard logged), and it needs nothing of the copy."""
    results = sessions["two_ranks_save"]
    for case in ("verl_path", "verl_path_without_copy"):
        assert_same_state(results[case]["loaded"], results["reference"]["saved"])
        assert not any("resharded" in line for line in results[case]["log"]), results[case]["log"]


def test_the_checkpoint_folder_holds_both_formats(sessions):
    saved_at_2, saved_at_1 = sessions["out"] / "saved_at_2" / "actor", sessions["out"] / "saved_at_1" / "actor"
    assert saved_world_sizes(str(saved_at_2)) == [2]
    assert saved_world_sizes(str(saved_at_1)) == [1]
    assert {f"{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim", "extra_state") for r in (0, 1)} <= {
        p.name for p in saved_at_2.iterdir()
    }
    assert has_reshardable_checkpoint(str(saved_at_2)) and has_reshardable_checkpoint(str(saved_at_1))
    done = json.loads((saved_at_2 / "dcp" / DONE_MARKER).read_text())
    assert done == {"world_size": 2, "contents": ["model", "optimizer", "extra"]}
    extra = torch.load(saved_at_2 / "dcp" / "extra_state.pt", weights_only=False)
    assert extra["world_size"] == 2 and extra["lr_scheduler"]["last_epoch"] == SAVED_AT_STEP


def test_save_contents_are_honoured(sessions):
    """checkpoint.save_contents=[model]: the copy holds the model only, as verl's files do."""
    model_only = sessions["out"] / "model_only" / "actor"
    assert json.loads((model_only / "dcp" / DONE_MARKER).read_text()) == {"world_size": 1, "contents": ["model"]}
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(model_only / "dcp")).read_metadata().state_dict_metadata
    assert keys and all(key.startswith("model.") for key in keys)
    assert not list(model_only.glob("optim_*")) and not (model_only / "dcp" / "extra_state.pt").exists()


def test_a_save_before_the_first_step_leaves_the_optimizer_as_it_was(sessions):
    """No optimizer state yet: the save adds none (torch would, by a zero-gradient step), the load restores none."""
    assert sessions["one_rank"]["untrained"] == {"state_after_save": 0, "state_after_load": 0, "params_equal": True}


def test_a_checkpoint_with_only_verls_files_at_another_world_size_is_a_clear_error(sessions):
    refusal = sessions["one_rank"]["verl_only"]
    error = refusal["error"]
    assert error is not None and refusal["untouched"]
    assert "loads at world size 1" in error and "saved at world size(s) [2]" in error
    assert "must resume at the world size that saved it" in error
    assert str(sessions["out"] / "verl_only" / "actor") in error


def test_an_interrupted_save_counts_as_absent_and_loads_nothing(sessions):
    refusal = sessions["one_rank"]["interrupted"]
    error = refusal["error"]
    assert error is not None and refusal["untouched"]
    assert "incomplete (no done.json: its save was interrupted)" in error
    assert not has_reshardable_checkpoint(str(sessions["out"] / "interrupted" / "actor"))


def test_the_patch_binds_the_manager_in_an_imported_engine_module(monkeypatch):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.workers.engine.fsdp import transformer_impl

    from verl_ext.checkpoint import patch

    # initialize() looks the name up in the module at call time: binding it there is enough.
    assert "FSDPCheckpointManager" in transformer_impl.FSDPEngine.initialize.__code__.co_names
    monkeypatch.setattr(transformer_impl, "FSDPCheckpointManager", FSDPCheckpointManager)  # restored after the test
    assert patch.apply() is True
    assert transformer_impl.FSDPCheckpointManager is ReshardableCheckpointManager
    assert patch.apply() is False  # idempotent

    class SomeoneElses(FSDPCheckpointManager):
        pass

    monkeypatch.setattr(transformer_impl, "FSDPCheckpointManager", SomeoneElses)
    assert patch.apply() is False and transformer_impl.FSDPCheckpointManager is SomeoneElses


# In a fresh interpreter: the plugin's ``import verl``, apply(), then what a worker imports.
_LAZY_BINDING = """
import json, sys
import verl
from verl_ext.checkpoint import patch
patch.apply()
early = patch.ENGINE_MODULE in sys.modules
print("-- applied --", file=sys.stderr, flush=True)
import FIRST_IMPORTER
from verl.workers.engine.fsdp import transformer_impl
print(json.dumps({
    "engine_imported_by_apply": early,
    "bound": transformer_impl.FSDPCheckpointManager.__qualname__,
    "finders_left": [type(f).__name__ for f in sys.meta_path if type(f).__module__ == patch.__name__],
}))
"""


@pytest.mark.parametrize(
    "first_importer",
    [
        "verl.workers.engine_workers",  # a worker
        "verl_ext.checkpoint.reshardable",  # a test or tool: the engine is imported while this module is half-built
    ],
)
def test_the_patch_waits_for_verl_to_import_the_engine(first_importer):
    """Applied inside ``import verl`` (the plugin), the patch imports no engine, so the console stays as verl leaves
    it; the first import of the engine module binds the name, and the finder that did it is gone."""
    code = _LAZY_BINDING.replace("FIRST_IMPORTER", first_importer)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "engine_imported_by_apply": False,
        "bound": "ReshardableCheckpointManager",
        "finders_left": [],
    }
    before_the_engine = result.stderr.split("-- applied --")[0]
    assert "engine is not available" not in before_the_engine, before_the_engine
