"""A named patch of verl for VLM batches whose sequences all have the same length (every process, every device).

``equal_length_position_ids`` lifts verl's assumption "a nested 3-D ``position_ids`` tensor is ragged on its token
dimension". Qwen2-VL's M-RoPE positions are ``(4, L_i)`` per sequence; verl keeps them as a jagged nested tensor
ragged on ``L_i`` (``_ragged_idx == 2``), and ``maybe_fix_3d_position_ids`` (``verl/utils/tensordict_utils.py``)
restores that index after tensordict's pickling resets it to 1, by setting ``_ragged_idx = 2`` unconditionally.
When every sequence of a batch has the same length, torch builds the nested tensor ragged on the *first* component
dimension (the 4 rows: ``_ragged_idx == 1``, offsets in steps of 4); forcing the index to 2 then corrupts it, and the
next ``index_select_tensor_dict`` in ``train_mini_batch`` dies with "split_with_sizes expects split_sizes to sum
exactly to 413 ... but got split_sizes=[4, 4, ...]". It happens on any device as soon as a step's prompts and
responses all have one length (one prompt template and image size, and a policy whose answers have collapsed).

The patched function keeps verl's fix where it applies (offsets count tokens: only the index was lost) and otherwise
rebuilds the tensor ragged on the tokens from its components. ``verl.workers.engine_workers`` and
``verl.workers.engine.base`` import the function by name; the patch rebinds it there too if they are already
imported, so it does not depend on import order.
"""

from __future__ import annotations

import sys

PATCH_NAME = "equal_length_position_ids"
_USERS = (
    "verl.utils.tensordict_utils",
    "verl.workers.engine_workers",
    "verl.workers.engine.base",
    "verl.workers.engine_workers_tinker",
)


def ragged_on_tokens(position_ids):
    """``position_ids`` (a nested ``(B, 4, j)`` tensor) as a nested tensor ragged on its token dimension."""
    from verl.utils.tensordict_utils import nested_tensor_from_tensor_list

    if position_ids._ragged_idx == 2:
        return position_ids
    values, offsets = position_ids.values(), position_ids.offsets()
    total = int(offsets[-1])
    if total == values.shape[1] and total != values.shape[0]:
        # Offsets count tokens: only the ragged index was lost (tensordict's pickling): verl's own fix.
        position_ids._ragged_idx = 2
        return position_ids
    # Ragged on the rows (every sequence the same length): its components are the (4, L) tensors.
    return nested_tensor_from_tensor_list(list(position_ids.unbind()), ragged_idx=2)


def maybe_fix_3d_position_ids(data) -> None:
    """verl's ``maybe_fix_3d_position_ids`` for any raggedness of the nested position ids (see the module)."""
    if "position_ids" in data.keys():
        position_ids = data["position_ids"]
        if position_ids.dim() == 3 and position_ids.is_nested:
            data["position_ids"] = ragged_on_tokens(position_ids)


maybe_fix_3d_position_ids._diva_patch = PATCH_NAME
# verl's own function, kept for the test that shows the assumption this patch lifts.
VERLS_FUNCTION = None


def apply() -> bool:
    """Rebind verl's function wherever it is bound (idempotent); returns True when this call patched something."""
    import verl.utils.tensordict_utils as defining  # the defining module first, before any user binds the name

    global VERLS_FUNCTION
    if VERLS_FUNCTION is None and defining.maybe_fix_3d_position_ids is not maybe_fix_3d_position_ids:
        VERLS_FUNCTION = defining.maybe_fix_3d_position_ids
    patched = False
    for name in _USERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "maybe_fix_3d_position_ids", None) is not maybe_fix_3d_position_ids:
            if hasattr(module, "maybe_fix_3d_position_ids"):
                module.maybe_fix_3d_position_ids = maybe_fix_3d_position_ids
                patched = True
    return patched
