"""CoDaPO's resampling: every training batch is used twice, fresh and then resampled (docs/algo/codapo.md).

The authors' trainer (``tmlr-group/CoDaPO``, ``codapo/ray_trainer.py``) serves each dataloader batch on two
consecutive steps. After the fresh step's advantage, with ``w`` the CoDaPO weight of each prompt group
(:func:`verl_ext.algos.compute_codapo_advantage`)::

    threshold = quantile({w_p : prompts p of the batch}, percentile)        numpy's / torch's linear quantile
    kept      = questions with a prompt whose w_p >= threshold, in order of first appearance in the batch
    resampled = (k_1 x repeat_count, k_2 x repeat_count, ..., k_m x repeat_count, k_1 x repeat_count, ...)
                cut to the batch's number of prompts

Ties at the threshold are all kept (more than ``1 - percentile`` of the questions can pass), and at least one
question always passes (the quantile is at most the largest weight). The resampled pass is rolled out as a
normal batch (``rollout.n`` responses per prompt; in verl's V1 each copy of a question is its own ``uid``
group), and its weights select nothing: the next batch is fresh again.

Differences from the authors' code, all on edge cases: questions are keyed by a stable id (``extra_info``'s
question id), not by the question text; a planned question maps to one row of the served batch
(:func:`rows_for`) where the authors' text match repeats every row with that text; the quantile is taken in
float64 (theirs in the weights' dtype, float32); an empty selection cannot hang the loop.

Hooking it into verl's V1 trainer (sync mode: a batch's advantage is computed before the next is fetched)::

    # __init__ / _load_checkpoint:   self.resampler = CoDaPOResampler(percentile, repeat_count)
    #                                self.resampler.load_state_dict(json.load(f))  # on resume
    # _fetch_one_gen_batch (or _next_train_batch, for the whole training batch):
    if self.resampler.resampled_next:
        keys = self.resampler.plan(num_prompts)              # the resampled pass; fresh comes next
        rows = rows_for(keys, self.fresh_question_keys)      # rows of the cached fresh batch (after a resume:
        batch_dict = take(self.fresh_batch_dict, rows)       # the dataset's key column and its rows instead)
        step_is_resampled = True
    else:
        batch_dict = next(dataloader_iterator)               # fresh; cache it and its question keys
        step_is_resampled = False
    batch_dict["uid"] = fresh uuid4 per row                  # as verl does, for both passes
    # _compute_advantage, after compute_codapo_advantage:
    if not step_is_resampled:
        self.resampler.observe(question_ids_per_response, weights, group_index=uid)
    metrics.update(self.resampler.metrics())
    # _save_checkpoint: json.dump(self.resampler.state_dict(), f)   (next to the dataloader state)

The state is JSON: whether a resampled pass is due and its questions, and the budget counters, so a resume
between the two passes of a batch rolls out the same resampled pass (the dataloader's own state, saved by verl,
already points past the fresh batch). Each dataloader batch takes two training steps, as in the authors' trainer
(whose wrapped dataloader reports twice its length): V1's ``steps_per_epoch = len(dataset) // train_batch_size``
must be doubled for ``trainer.total_epochs`` to mean full epochs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

STATE_VERSION = 1
METRIC_PREFIX = "codapo/resample/"
_LAST_KEYS = ("threshold", "kept_questions", "kept_fraction", "copies_per_kept", "kept_budget_share")


class Selection(NamedTuple):
    """What :func:`select_questions` picked from one fresh batch."""

    kept: list  # kept question keys, in order of first appearance in the batch
    threshold: float  # the batch's weight quantile
    units: int  # prompts the quantile ran over (questions, without group_index)
    kept_units: int  # of those, how many reached the threshold


def select_questions(question_keys: Any, weights: Any, percentile: float = 0.75, group_index: Any = None) -> Selection:
    """The questions of a fresh batch whose weight reaches the batch's ``percentile`` quantile.

    Args:
        question_keys: one stable question id (``str`` or ``int``) per entry: per response or per prompt.
        weights: one CoDaPO weight per entry (tensor, array or list).
        percentile: the quantile, in (0, 1), the weight must reach (``w >= quantile``, numpy's linear quantile).
        group_index: optional prompt-group id per entry (verl's ``uid``): the quantile is then over prompt groups,
            as the authors' code takes it, and a question is kept when any of its prompts passes. Without it each
            question is one unit, and its entries must share one weight.

    Returns:
        a :class:`Selection`.
    """
    _check_percentile(percentile)
    keys = _keys_array(question_keys, "question_keys")
    values = _weights_array(weights, len(keys))
    if group_index is None:
        unit_of, uniques = pd.factorize(keys)
        unit_name = "question (pass group_index=uid when a question's prompts have different weights)"
    else:
        groups = group_index.detach().cpu().numpy() if isinstance(group_index, torch.Tensor) else group_index
        groups = groups if isinstance(groups, np.ndarray) else np.asarray(groups, dtype=object)
        if groups.shape != (len(keys),):
            raise ValueError(f"group_index must have one id per entry ({len(keys)}), got shape {groups.shape}")
        unit_of, uniques = pd.factorize(groups)
        if unit_of.min() < 0:
            raise ValueError(f"group_index is missing for entry {int(np.flatnonzero(unit_of < 0)[0])}")
        unit_name = "prompt group (group_index)"
    first = _first_rows(unit_of, len(uniques))
    unit_weight = values[first]
    _check_one_per_unit(values, unit_weight[unit_of], "weights", unit_name)
    unit_key = keys[first]
    if group_index is not None:
        _check_one_per_unit(keys, unit_key[unit_of], "question_keys", unit_name)
    threshold = float(np.quantile(unit_weight, percentile, method="linear"))
    kept_units = unit_weight >= threshold
    kept = pd.unique(unit_key[kept_units]).tolist()  # units are numbered by first appearance
    return Selection(kept, threshold, len(uniques), int(kept_units.sum()))


def resampled_pass(kept: list, batch_size: int, repeat_count: int = 4) -> list:
    """``batch_size`` question keys: each kept question ``repeat_count`` times in a row, cycling, truncated."""
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    _check_repeat_count(repeat_count)
    if not kept:
        raise ValueError("kept is empty: a resampled pass needs at least one question")
    tiled = np.repeat(np.asarray(kept, dtype=object), repeat_count)
    return np.resize(tiled, int(batch_size)).tolist()  # np.resize repeats the array cyclically


def rows_for(plan: list, served_keys: Any) -> np.ndarray:
    """``(len(plan),) int64`` row of ``served_keys`` (a served batch's, or the dataset's, question key per row)
    holding each planned key: its first row. ``ValueError`` naming the first planned key it lacks."""
    served = _keys_array(served_keys, "served_keys")
    codes, uniques = pd.factorize(served)
    first = _first_rows(codes, len(uniques))
    found = pd.Index(uniques).get_indexer(_keys_array(plan, "plan"))
    if (found < 0).any():
        missing = plan[int(np.flatnonzero(found < 0)[0])]
        raise ValueError(f"planned question {missing!r} is not among served_keys; serve the pass from its fresh batch")
    return first[found].astype(np.int64)


class CoDaPOResampler:
    """The alternation fresh -> resampled over the training batches, with its JSON state (module docstring).

    ``observe`` a fresh batch's weights, then ``plan`` its resampled pass; :attr:`resampled_next` says which
    kind the next batch is. ``metrics()`` (``codapo/resample/*``):

    - ``threshold``, ``kept_questions``, ``kept_fraction`` (kept / units of the quantile) of the last fresh batch;
    - ``copies_per_kept``: the last resampled pass's prompts per kept question (``batch_size / kept``);
    - ``budget_share``: share of all prompts served so far (fresh batches observed + resampled passes) that
      were resampled ones (0.5 when every batch is used twice);
    - ``kept_budget_share``: share of the last batch pair's prompts (fresh + resampled) that went to the kept
      questions, e.g. ``(0.25 + 1) / 2 = 0.625`` for a quarter kept.
    """

    def __init__(self, percentile: float = 0.75, repeat_count: int = 4):
        _check_percentile(percentile)
        _check_repeat_count(repeat_count)
        self.percentile = float(percentile)
        self.repeat_count = int(repeat_count)
        self._pending: list | None = None  # the kept questions of the last observed fresh batch, not yet planned
        # The last selection's and the last pass's figures (0 until there is one), so every step logs the same keys.
        self._last: dict[str, float] = dict.fromkeys(_LAST_KEYS, 0.0)
        self._fresh_prompts = 0
        self._resampled_prompts = 0
        self._pending_fresh = (0, 0)  # (prompts, prompts of kept questions) of the pending fresh batch

    @property
    def resampled_next(self) -> bool:
        """Whether the next batch is the resampled pass of the last observed fresh batch."""
        return self._pending is not None

    def observe(self, question_keys: Any, weights: Any, group_index: Any = None) -> list:
        """Record a fresh batch's weights (one entry per response or per prompt, see :func:`select_questions`)
        and select its resampled pass's questions; returns them. Call it for fresh batches only."""
        if self._pending is not None:
            raise RuntimeError(
                "CoDaPOResampler.observe: the previous fresh batch's resampled pass was never planned; observe "
                "fresh batches only, and plan() the resampled pass before the next fresh batch"
            )
        kept, threshold, units, kept_units = select_questions(question_keys, weights, self.percentile, group_index)
        self._pending = kept
        self._fresh_prompts += units
        self._pending_fresh = (units, kept_units)
        self._last.update(threshold=threshold, kept_questions=float(len(kept)), kept_fraction=kept_units / units)
        return list(kept)

    def plan(self, batch_size: int) -> list:
        """The resampled pass's ``batch_size`` question keys (see :func:`resampled_pass`); the next batch is
        fresh again."""
        if self._pending is None:
            raise RuntimeError("CoDaPOResampler.plan: no fresh batch observed since the last resampled pass")
        keys = resampled_pass(self._pending, batch_size, self.repeat_count)
        fresh, fresh_kept = self._pending_fresh
        self._resampled_prompts += len(keys)
        self._last.update(
            copies_per_kept=len(keys) / len(self._pending),
            kept_budget_share=(fresh_kept + len(keys)) / (fresh + len(keys)),
        )
        self._pending = None
        return keys

    def metrics(self) -> dict[str, float]:
        total = self._fresh_prompts + self._resampled_prompts
        out = {METRIC_PREFIX + name: value for name, value in self._last.items()}
        out[METRIC_PREFIX + "budget_share"] = self._resampled_prompts / total if total else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the pending resampled pass, the last selection figures, the budget counters."""
        return {
            "version": STATE_VERSION,
            "pending": None if self._pending is None else list(self._pending),
            "pending_fresh": list(self._pending_fresh),
            "last": dict(self._last),
            "fresh_prompts": self._fresh_prompts,
            "resampled_prompts": self._resampled_prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"CoDaPOResampler state must be a dict with version {STATE_VERSION}, got {state!r:.200}")
        missing = {"pending", "pending_fresh", "last", "fresh_prompts", "resampled_prompts"} - set(state)
        if missing:
            raise ValueError(f"CoDaPOResampler state lacks {sorted(missing)}")
        pending = state["pending"]
        if pending is not None:
            pending = _keys_array(pending, "CoDaPOResampler state['pending']").tolist()  # null or keys, not []
        fresh, fresh_kept = (int(v) for v in state["pending_fresh"])
        self._pending = pending
        self._pending_fresh = (fresh, fresh_kept)
        self._last = dict.fromkeys(_LAST_KEYS, 0.0) | {str(k): float(v) for k, v in dict(state["last"]).items()}
        self._fresh_prompts = int(state["fresh_prompts"])
        self._resampled_prompts = int(state["resampled_prompts"])


def _first_rows(codes: np.ndarray, count: int) -> np.ndarray:
    """Row of the first appearance of each code ``0..count-1`` (``pd.factorize`` numbers by first appearance)."""
    first = np.full(count, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.int64))
    return first


def _keys_array(keys: Any, name: str) -> np.ndarray:
    """Object array of Python ``str`` / ``int`` keys (JSON-serialisable, stable across processes)."""
    if isinstance(keys, torch.Tensor):
        keys = keys.detach().cpu().tolist()
    elif isinstance(keys, np.ndarray):
        keys = keys.tolist()  # numpy scalars -> Python str / int
    array = np.empty(len(keys), dtype=object) if isinstance(keys, (list, tuple)) else None
    if array is None:
        raise ValueError(f"{name} must be a list, tuple, numpy array or tensor of keys, got {type(keys).__name__}")
    try:
        array[:] = keys
    except ValueError as err:
        raise ValueError(f"{name} must hold one str or int key per entry: {err}") from err
    if len(array) == 0:
        raise ValueError(f"{name} is empty")
    kinds = pd.Series(array).map(type)
    bad = ~kinds.isin([str, int]).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}: entry {row} is {array[row]!r} ({type(array[row]).__name__}); question keys must be str or "
            "int (the stable question id of extra_info, never the per-step uid)"
        )
    return array


def _weights_array(weights: Any, size: int) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().to(torch.float64).numpy()
    try:
        values = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"weights must be numbers, one per entry: {err}") from err
    if values.shape != (size,):
        raise ValueError(f"weights must have one value per question key ({size}), got shape {values.shape}")
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"weights must be finite; entry {row} has {values[row]}")
    return values


def _check_one_per_unit(values: np.ndarray, unit_values: np.ndarray, name: str, unit_name: str) -> None:
    differs = values != unit_values
    if differs.any():
        row = int(np.flatnonzero(differs)[0])
        raise ValueError(
            f"{name}: entry {row} has {values[row]!r} but an earlier entry of its {unit_name} has "
            f"{unit_values[row]!r}; there must be one per {unit_name}"
        )


def _check_percentile(percentile: float) -> None:
    if not isinstance(percentile, (int, float)) or not math.isfinite(percentile) or not 0 < percentile < 1:
        raise ValueError(f"percentile must be in (0, 1), got {percentile!r}")


def _check_repeat_count(repeat_count: int) -> None:
    if not isinstance(repeat_count, (int, np.integer)) or isinstance(repeat_count, bool) or repeat_count < 1:
        raise ValueError(f"repeat_count must be a positive integer, got {repeat_count!r}")
