"""Reading non-tensor fields (``extra_info``, ``uid``, ...) fetched from verl's TransferQueue."""

from __future__ import annotations

from tensordict import NonTensorData


def non_tensor_list(value) -> list:
    """A TransferQueue non-tensor field as a plain list of Python objects.

    Depending on the backend and on how a row was written (rollout output or verl's synthetic padding rows),
    the field comes back as a ``NonTensorStack``, a tensordict ``LinkedList`` or a numpy array, and single
    items may still be wrapped in ``NonTensorData``; this unwraps all of them.
    """
    items = value.tolist() if hasattr(value, "tolist") else list(value)
    return [item.data if isinstance(item, NonTensorData) else item for item in items]
