"""verl's estimator for a toolkit method, deferred while the toolkit trainer runs verl's own advantage step.

The toolkit trainer (``recipe/diva_grpo/toolkit_trainer.py``) calls verl's ``_compute_advantage`` as it is: the KL
penalty in the reward, rollout correction (importance weights, rejection sampling), the estimator and the write-back
to TransferQueue. A toolkit method needs fields verl's estimator call does not pass (question groups, difficulties,
old or blind log-probs, reward extras), so the trainer computes it after verl's step, from what that step wrote.
Inside :func:`estimator_deferred`, the estimator verl calls for the method returns zeros, which the trainer
overwrites before anything reads them; everywhere else the registered function runs (a plain verl estimator, or a
refusal naming the trainer the method needs).

No verl import here: the plugin, which verl loads while it is itself being imported, registers through
:func:`deferring`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEFERRED: ContextVar[str | None] = ContextVar("verl_ext_deferred_estimator", default=None)


@contextmanager
def estimator_deferred(name: str) -> Iterator[None]:
    """Inside, verl's estimator ``name`` (registered through :func:`deferring`) returns zero advantages."""
    token = _DEFERRED.set(name)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def deferring(name: str, fn: Callable) -> Callable:
    """``fn`` (verl's estimator signature) as registered under ``name``: zeros inside
    :func:`estimator_deferred` for ``name``, else ``fn``. The wrapper keeps ``fn``'s module and names: verl's
    registry and :func:`verl_ext.plugin.check_registered` identify the estimator by them."""

    def estimator(*args, **kwargs):
        if _DEFERRED.get() == name:
            import torch

            rewards = kwargs["token_level_rewards"] if "token_level_rewards" in kwargs else args[0]
            return torch.zeros_like(rewards), torch.zeros_like(rewards)
        return fn(*args, **kwargs)

    estimator.__name__, estimator.__qualname__ = fn.__name__, fn.__qualname__
    estimator.__module__, estimator.__doc__ = fn.__module__, fn.__doc__
    estimator.__wrapped__ = fn
    return estimator
