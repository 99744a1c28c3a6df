"""Input checks and the mask broadcast shared by every advantage function of ``verl_ext.algos``.

Each estimator validates its inputs the same way (``ValueError`` naming the argument and the first bad row)
and writes its ``(B, T)`` output with :func:`broadcast_over_mask`, the one O(B*T) write, tuned for the int64
mask verl passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# The O(B) group math runs in float64 whatever the input dtype: it costs nothing next to the (B, T) pass.
STAT_DTYPE = torch.float64


def check_rewards_and_mask(token_level_rewards: Any, response_mask: Any) -> None:
    if not isinstance(token_level_rewards, torch.Tensor) or not token_level_rewards.is_floating_point():
        raise ValueError(
            f"token_level_rewards must be a floating-point torch.Tensor, got {describe(token_level_rewards)}"
        )
    if token_level_rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be (B, T), got shape {tuple(token_level_rewards.shape)}")
    if not isinstance(response_mask, torch.Tensor):
        raise ValueError(f"response_mask must be a torch.Tensor, got {describe(response_mask)}")
    check_like_rewards(response_mask, "response_mask", token_level_rewards)


def check_like_rewards(
    value: torch.Tensor, name: str, token_level_rewards: torch.Tensor, *, same_device: bool = True
) -> None:
    """``ValueError`` naming ``name`` unless the tensor ``value`` has ``token_level_rewards``' ``(B, T)`` shape
    and (``same_device``) its device."""
    if value.shape != token_level_rewards.shape:
        raise ValueError(
            f"{name} has shape {tuple(value.shape)} but token_level_rewards has "
            f"{tuple(token_level_rewards.shape)}; they must match"
        )
    if same_device and value.device != token_level_rewards.device:
        raise ValueError(f"{name} is on {value.device} but token_level_rewards on {token_level_rewards.device}")


def check_log_probs(
    old_log_probs: Any,
    token_level_rewards: torch.Tensor,
    why_required: str,
    name: str = "old_log_probs",
    *,
    same_device: bool = True,
) -> None:
    """``ValueError`` naming ``name`` unless ``old_log_probs`` is a floating-point ``(B, T)`` tensor shaped like
    ``token_level_rewards`` (and, ``same_device``, on its device). ``why_required`` follows "``name`` is required"
    in the message for ``None``: what the method reads them for and where the trainer gets them."""
    if old_log_probs is None:
        raise ValueError(f"{name} is required{why_required}")
    if not isinstance(old_log_probs, torch.Tensor) or not old_log_probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor, got {describe(old_log_probs)}")
    check_like_rewards(old_log_probs, name, token_level_rewards, same_device=same_device)


def sequence_scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64 sequence scores ``s_i = sum_t token_level_rewards[i, t]``, checked finite.

    The only O(B*T) read of the rewards, summed in the input dtype as verl does (a ``dtype=`` argument would cast
    the whole ``(B, T)`` tensor first); a non-finite reward makes its row sum non-finite.
    """
    scores = token_level_rewards.sum(dim=-1).to(STAT_DTYPE)
    check_finite(scores, "token_level_rewards: every row sum must be finite")
    return scores


def broadcast_over_mask(per_response: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` output ``per_response[:, None] * response_mask`` in ``per_response.dtype``, checking that
    the mask holds only 0 and 1. This is the one O(B*T) write; it reads the mask as few times as its dtype allows:

    - bool / integer mask: torch's mixed-dtype multiply is slow (it converts element by element), so the mask
      is converted straight into the output buffer, range-checked there (an integer in [0, 1] is 0 or 1; the
      float copy is half the bytes of int64), then scaled in place. No temporary beyond the output.
    - floating mask: one fused multiply into the output, after an exact 0/1 check on the mask (range, then
      "the nonzero entries are exactly the entries equal to 1"), which costs two extra reads of the mask.
    """
    advantages = torch.empty(response_mask.shape, dtype=per_response.dtype, device=per_response.device)
    if response_mask.is_floating_point():
        if not _is_zero_one(response_mask):
            _raise_bad_mask(response_mask)
        return torch.mul(per_response.unsqueeze(-1), response_mask, out=advantages)
    advantages.copy_(response_mask)
    if response_mask.dtype != torch.bool and not _is_zero_one(advantages, integer_valued=True):
        _raise_bad_mask(response_mask)
    return advantages.mul_(per_response.unsqueeze(-1))


def _is_zero_one(mask: torch.Tensor, integer_valued: bool = False) -> bool:
    """Whether every entry of ``mask`` is 0 or 1; ``integer_valued``: its entries are known to be integers."""
    if mask.numel() == 0:
        return True
    low, high = torch.aminmax(mask)  # NaN makes both comparisons below false
    if not (bool(low >= 0) and bool(high <= 1)):
        return False
    if integer_valued or not mask.is_floating_point():
        return True  # an integer in [0, 1] is 0 or 1
    # Values in [0, 1]: 0/1 iff every nonzero entry equals 1 (counting, since sums of floats round).
    return bool(torch.count_nonzero(mask) == torch.count_nonzero(mask.eq(1)))


def _raise_bad_mask(response_mask: torch.Tensor) -> None:
    bad = ~((response_mask == 0) | (response_mask == 1))
    row = int(bad.any(dim=-1).nonzero()[0, 0])
    value = response_mask[row][bad[row]][0].item()
    raise ValueError(f"response_mask must hold only 0 and 1; row {row} holds {value}")


def check_finite(values: torch.Tensor, what: str) -> None:
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise ValueError(f"{what}; response {row} has {values[row].item()}")


def per_response_tensor(values: Any, name: str, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(B,)`` float64 tensor of one finite number per response, from a tensor, numpy array or list.

    ``name`` is the argument named in the ``ValueError`` raised for a wrong length, non-numbers or NaN/inf.
    """
    if values is None:
        raise ValueError(f"{name} is required: one number per response ({batch_size})")
    if isinstance(values, torch.Tensor):
        out = values.detach().to(device=device, dtype=STAT_DTYPE)
    else:
        try:
            out = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be numbers, one per response: {err}") from err
    if out.dim() != 1 or out.shape[0] != batch_size:
        raise ValueError(f"{name} must have shape ({batch_size},), one per response, got {tuple(out.shape)}")
    check_finite(out, f"{name}: every value must be finite")
    return out


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return type(value).__name__
