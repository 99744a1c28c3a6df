"""The patch equal_length_position_ids (verl_ext/position_ids_patch.py): verl's maybe_fix_3d_position_ids corrupts
the nested M-RoPE position ids of a batch whose sequences all have one length; the patched function does not, and
keeps verl's own fix for position ids whose ragged index tensordict's pickling lost."""

from __future__ import annotations

import pickle

import pytest
import torch
import verl  # noqa: F401  (loads the plugin, which applies the patch)
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from verl_ext import position_ids_patch

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack


def _batch(lengths: list[int]) -> tuple[TensorDict, list[torch.Tensor]]:
    rows = [torch.arange(4 * n).view(4, n) + 1000 * i for i, n in enumerate(lengths)]
    nested = (
        torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        if len(set(lengths)) == 1
        else tu.nested_tensor_from_tensor_list(rows, ragged_idx=2)
    )
    return TensorDict({"position_ids": nested}, batch_size=[len(lengths)]), rows


def _selected(td: TensorDict, indices: list[int]) -> list[torch.Tensor]:
    return list(tu.index_select_tensor_dict(td, torch.tensor(indices))["position_ids"].unbind())


def test_verls_function_corrupts_equal_length_position_ids():
    td, _ = _batch([413] * 32)
    assert td["position_ids"]._ragged_idx == 1  # torch's choice when every component has one shape
    position_ids_patch.VERLS_FUNCTION(td)
    with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 413"):
        _selected(td, [3, 0])


@pytest.mark.parametrize("lengths", [[413] * 32, [5, 9, 7, 6], [12]])
def test_patched_function_keeps_every_row(lengths):
    td, rows = _batch(lengths)
    tu.maybe_fix_3d_position_ids(td)  # the patched function, as verl's worker modules now call it
    picked = _selected(td, [len(lengths) - 1, 0])
    assert torch.equal(picked[0], rows[-1]) and torch.equal(picked[1], rows[0])


def test_patched_function_keeps_verls_fix_after_pickling():
    td, rows = _batch([5, 9, 7, 6])
    td = pickle.loads(pickle.dumps(td.consolidate()))
    assert td["position_ids"]._ragged_idx == 1  # tensordict lost it (what verl's own function repairs)
    tu.maybe_fix_3d_position_ids(td)
    assert td["position_ids"]._ragged_idx == 2
    assert torch.equal(_selected(td, [1])[0], rows[1])


def test_verls_worker_modules_call_the_patched_function():
    from verl.workers import engine_workers
    from verl.workers.engine import base

    for module in (tu, engine_workers, base):
        assert module.maybe_fix_3d_position_ids is position_ids_patch.maybe_fix_3d_position_ids, module.__name__
    assert position_ids_patch.apply() is False  # idempotent
