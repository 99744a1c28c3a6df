"""Per-question difficulty state and its batched update (pure Python + numpy; no Ray).

Each question, keyed by the stable question id carried in ``extra_info`` (str or int; never verl's
per-step ``uid``), holds:

- ``difficulty``: current D_q in [d_min, d_max] (unknown ids read as ``d_init``),
- ``updates``: how many step updates touched it,
- ``last_step``: the trainer step of its last update,
- ``last_alpha``: its success rate alpha at that update.

One :meth:`DifficultyTracker.update` call per trainer step moves every question of the batch with the
configured rule (:mod:`verl_ext.difficulty.rules`). Every call bumps ``version``; each question remembers
the version that last changed it, so :meth:`changes_since` gives a reader (the trainer's shared table) just
the entries it has not seen, not the whole table, each step.

Bad input (NaN/inf alpha, alpha outside [0, 1], lists of different lengths, repeated or non str/int ids)
raises ``ValueError`` naming the argument before anything is changed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from verl_ext.difficulty.alphas import check_unit_interval
from verl_ext.difficulty.rules import make_update_rule

METRIC_PREFIX = "diva/difficulty/"
STATE_FORMAT = "diva_difficulty_state"
STATE_FORMAT_VERSION = 1
# Request ids of recent updates kept to make a retried update (after an actor restart) a no-op.
RECENT_REQUESTS_KEPT = 256

if TYPE_CHECKING:  # verl_ext.config imports verl, which imports Ray: keep this module free of both.
    from verl_ext.config import DifficultyConfig


@dataclass(frozen=True)
class UpdateRecord:
    """One validated step update, with its results: everything needed to apply (or replay) it exactly.

    ``question_ids`` has length Q; ``alphas`` and ``difficulty`` (the new values) have shape ``(Q,)``.
    """

    question_ids: list
    alphas: np.ndarray
    difficulty: np.ndarray
    step: int
    version: int
    request_id: str | None = None

    def __len__(self) -> int:
        return len(self.question_ids)

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "step": self.step,
            "request_id": self.request_id,
            "ids": self.question_ids,
            "alpha": self.alphas.tolist(),
            "difficulty": self.difficulty.tolist(),
        }

    @classmethod
    def from_json(cls, data: dict) -> UpdateRecord:
        """Rebuild a journal record; ``ValueError`` if its arrays disagree in length or hold non-finite values
        (a damaged record must stop the restore, never be broadcast into the state)."""
        ids = [normalize_question_id(q, "ids") for q in data["ids"]]
        alphas = np.asarray(data["alpha"], dtype=np.float64)
        difficulty = np.asarray(data["difficulty"], dtype=np.float64)
        if alphas.shape != (len(ids),) or difficulty.shape != (len(ids),):
            raise ValueError(f"{len(ids)} ids but alpha has shape {alphas.shape} and difficulty {difficulty.shape}")
        if not (np.isfinite(alphas).all() and np.isfinite(difficulty).all()):
            raise ValueError("alpha and difficulty must be finite")
        return cls(
            question_ids=ids,
            alphas=alphas,
            difficulty=difficulty,
            step=int(data["step"]),
            version=int(data["version"]),
            request_id=data.get("request_id"),
        )


def normalize_question_id(qid, name: str = "question_ids"):
    """A question id as plain ``str`` or ``int`` (numpy scalars converted); ``ValueError`` otherwise.

    Plain types keep ids exact through JSON (a list keeps ``1`` and ``"1"`` apart) and through Ray.
    """
    if isinstance(qid, bool) or not isinstance(qid, str | int | np.integer | np.str_):
        raise ValueError(f"{name}: question id {qid!r} has type {type(qid).__name__}; ids must be str or int")
    return str(qid) if isinstance(qid, str | np.str_) else int(qid)


class DifficultyTracker:
    """Difficulty of every question seen so far, and the rule that moves it.

    Args:
        config: a :class:`~verl_ext.config.DifficultyConfig`, or a mapping of its fields (``None``: paper defaults).
    """

    def __init__(self, config: DifficultyConfig | Mapping | None = None):
        if config is None:
            from verl_ext.config import DifficultyConfig

            config = DifficultyConfig()
        elif not hasattr(config, "rule"):
            # A plain mapping of DifficultyConfig's fields: what the Ray actor receives, so that its process
            # need not import verl (seconds of start-up) just to read a dataclass.
            config = SimpleNamespace(**config)
        self.config = config
        self._rule = make_update_rule(self.config)
        self._d_init = float(self.config.d_init)
        self._clear()

    def _clear(self) -> None:
        self._slot_of: dict[Hashable, int] = {}
        self._ids: list = []
        capacity = 1024
        self._difficulty = np.empty(capacity, dtype=np.float64)
        self._updates = np.empty(capacity, dtype=np.int64)
        self._last_step = np.empty(capacity, dtype=np.int64)
        self._last_alpha = np.empty(capacity, dtype=np.float64)
        self._changed_at = np.empty(capacity, dtype=np.int64)
        self.version = 0
        # Readers that last synced before this version must rebuild from scratch (a state was loaded).
        self.reset_version = 0
        self._recent_requests: OrderedDict[str, int] = OrderedDict()
        self._updates_in_last_step = 0

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._ids)

    def difficulties(self, question_ids: Sequence[Hashable]) -> np.ndarray:
        """Current difficulty of each id, shape ``(len(question_ids),)``; unknown ids give ``d_init``."""
        out = np.full(len(question_ids), self._d_init, dtype=np.float64)
        for i, qid in enumerate(question_ids):
            slot = self._slot_of.get(qid)
            if slot is not None:
                out[i] = self._difficulty[slot]
        return out

    def state_of(self, question_id: Hashable) -> dict:
        """``{difficulty, updates, last_step, last_alpha}`` of one question (defaults for an unknown id)."""
        slot = self._slot_of.get(question_id)
        if slot is None:
            return {"difficulty": self._d_init, "updates": 0, "last_step": -1, "last_alpha": math.nan}
        return {
            "difficulty": float(self._difficulty[slot]),
            "updates": int(self._updates[slot]),
            "last_step": int(self._last_step[slot]),
            "last_alpha": float(self._last_alpha[slot]),
        }

    def snapshot(self) -> dict:
        """``{question_id: difficulty}`` for every question seen."""
        return dict(zip(self._ids, self._difficulty[: len(self._ids)].tolist(), strict=True))

    def changes_since(self, version: int) -> tuple[int, bool, list, np.ndarray]:
        """Entries changed after ``version``: ``(current_version, full, ids, difficulties)``.

        ``full`` is true when the reader must first reset every row to ``d_init`` (it synced before the last
        :meth:`load_state_dict`, or never: ``version < 0``); then every entry is returned. ``difficulties`` has
        shape ``(len(ids),)``.
        """
        n = len(self._ids)
        if version < self.reset_version or version < 0:
            return self.version, True, list(self._ids), self._difficulty[:n].copy()
        slots = np.flatnonzero(self._changed_at[:n] > version)
        return self.version, False, [self._ids[s] for s in slots.tolist()], self._difficulty[slots]

    def metrics(self) -> dict[str, float]:
        """Scalars for the trainer's logger, keys prefixed ``diva/difficulty/``.

        ``mean`` (over questions seen; ``d_init`` before any), ``count_level_L`` for each integer level L in
        [ceil(d_min), floor(d_max)] (D rounded half up, so 4.5 counts as level 5), ``frac_at_min`` /
        ``frac_at_max`` (share of seen questions sitting on a bound), ``questions_seen`` and
        ``updates_in_step`` (questions moved by the last update call).
        """
        d = self._difficulty[: len(self._ids)]
        lo, hi = math.ceil(self.config.d_min), math.floor(self.config.d_max)
        out = {
            "mean": float(d.mean()) if d.size else self._d_init,
            "frac_at_min": float(np.mean(d <= self.config.d_min)) if d.size else 0.0,
            "frac_at_max": float(np.mean(d >= self.config.d_max)) if d.size else 0.0,
            "questions_seen": float(d.size),
            "updates_in_step": float(self._updates_in_last_step),
        }
        if hi >= lo:
            levels = np.clip(np.floor(d + 0.5), lo, hi).astype(np.int64) - lo
            counts = np.bincount(levels, minlength=hi - lo + 1)
            for level, count in zip(range(lo, hi + 1), counts.tolist(), strict=True):
                out[f"count_level_{level}"] = float(count)
        return {METRIC_PREFIX + k: v for k, v in out.items()}

    # ------------------------------------------------------------------ updating
    def compute_update(
        self,
        question_ids: Sequence[Hashable],
        alphas: Sequence[float],
        step: int,
        request_id: str | None = None,
        priors: Sequence[float] | None = None,
    ) -> UpdateRecord:
        """Validate one step's update and compute the new difficulties, without changing any state.

        Args:
            question_ids: distinct stable question ids, length Q.
            alphas: each question's success rate in [0, 1], length Q.
            step: the trainer's global step (int >= 0).
            request_id: optional caller token; an update whose id was already applied is skipped by :meth:`apply`.
            priors: optional starting difficulty of each id, length Q, used only for ids this tracker has not seen
                yet (the dataset's initial difficulty from the parquet ``difficulty`` column); ``None``: ``d_init``.
        """
        ids = [normalize_question_id(q) for q in question_ids]
        alpha = check_unit_interval(alphas, "alphas")
        if len(ids) != alpha.size:
            raise ValueError(
                f"question_ids has {len(ids)} entries but alphas has {alpha.size}; give one alpha per question"
            )
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if len(set(ids)) != len(ids):
            seen = set()
            dup = next(q for q in ids if q in seen or seen.add(q))
            raise ValueError(
                f"question_ids: id {dup!r} appears more than once in one update; average its responses first "
                "(verl_ext.difficulty.question_alphas)"
            )
        if request_id is not None and not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str or None, got {type(request_id).__name__}")
        current = self.difficulties(ids)
        if priors is not None:
            prior = np.asarray(priors, dtype=np.float64)
            if prior.shape != (len(ids),):
                raise ValueError(f"priors has shape {prior.shape}; give one starting difficulty per question id")
            lo, hi = float(self.config.d_min), float(self.config.d_max)
            bad = ~np.isfinite(prior) | (prior < lo) | (prior > hi)
            if bad.any():
                pos = int(np.flatnonzero(bad)[0])
                raise ValueError(f"priors[{pos}] = {prior[pos]!r}: every prior must be finite and in [{lo}, {hi}]")
            unseen = np.fromiter((q not in self._slot_of for q in ids), dtype=bool, count=len(ids))
            current[unseen] = prior[unseen]
        new = self._rule(current, alpha)
        return UpdateRecord(ids, alpha, new, int(step), self.version + 1, request_id)

    def is_applied(self, request_id: str | None) -> bool:
        return request_id is not None and request_id in self._recent_requests

    def apply(self, record: UpdateRecord) -> None:
        """Apply a record from :meth:`compute_update` (or a journal replay). A repeated request id is skipped."""
        if self.is_applied(record.request_id):
            return
        slots = np.fromiter((self._slot_for(q) for q in record.question_ids), dtype=np.int64, count=len(record))
        self._difficulty[slots] = record.difficulty
        self._updates[slots] += 1
        self._last_step[slots] = record.step
        self._last_alpha[slots] = record.alphas
        self._changed_at[slots] = record.version
        self.version = record.version
        self._updates_in_last_step = len(record)
        if record.request_id is not None:
            self._recent_requests[record.request_id] = record.version
            while len(self._recent_requests) > RECENT_REQUESTS_KEPT:
                self._recent_requests.popitem(last=False)

    def update(
        self, question_ids: Sequence[Hashable], alphas: Sequence[float], step: int, request_id: str | None = None
    ) -> dict[str, float]:
        """Move each question's difficulty by the rule; returns :meth:`metrics` after the update."""
        if not self.is_applied(request_id):
            self.apply(self.compute_update(question_ids, alphas, step, request_id))
        return self.metrics()

    def _slot_for(self, qid) -> int:
        slot = self._slot_of.get(qid)
        if slot is not None:
            return slot
        slot = len(self._ids)
        if slot == self._difficulty.size:
            self._grow()
        self._slot_of[qid] = slot
        self._ids.append(qid)
        self._difficulty[slot] = self._d_init
        self._updates[slot] = 0
        self._last_step[slot] = -1
        self._last_alpha[slot] = math.nan
        self._changed_at[slot] = 0
        return slot

    def _grow(self) -> None:
        for name in ("_difficulty", "_updates", "_last_step", "_last_alpha", "_changed_at"):
            old = getattr(self, name)
            new = np.empty(old.size * 2, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """A JSON-serialisable copy of the whole state (ids kept in a list so int and str ids stay apart)."""
        n = len(self._ids)
        return {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "rule": self.config.rule,
            "version": self.version,
            "recent_requests": list(self._recent_requests),
            "questions": {
                "ids": list(self._ids),
                "difficulty": self._difficulty[:n].tolist(),
                "updates": self._updates[:n].tolist(),
                "last_step": self._last_step[:n].tolist(),
                # JSON has no NaN; null marks "never observed".
                "last_alpha": [None if math.isnan(a) else a for a in self._last_alpha[:n].tolist()],
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the whole state with ``state`` (from :meth:`state_dict`). Validated first: on a malformed
        state, ``ValueError`` naming the key and nothing changes. Readers get a full refresh afterwards."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a difficulty state: expected 'format': {STATE_FORMAT!r}")
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise ValueError(
                f"difficulty state has format_version {state.get('format_version')!r}; "
                f"this code reads {STATE_FORMAT_VERSION}"
            )
        try:
            q = state["questions"]
            ids = [normalize_question_id(x, "questions.ids") for x in q["ids"]]
            difficulty = np.asarray(q["difficulty"], dtype=np.float64)
            updates = np.asarray(q["updates"], dtype=np.int64)
            last_step = np.asarray(q["last_step"], dtype=np.int64)
            last_alpha = np.asarray([math.nan if a is None else a for a in q["last_alpha"]], dtype=np.float64)
            version = int(state["version"])
            recent = [str(r) for r in state.get("recent_requests", [])]
        except (KeyError, TypeError, ValueError, OverflowError) as err:  # OverflowError: an int beyond int64
            raise ValueError(f"difficulty state is malformed: {type(err).__name__}: {err}") from None
        n = len(ids)
        for key, arr in (
            ("difficulty", difficulty),
            ("updates", updates),
            ("last_step", last_step),
            ("last_alpha", last_alpha),
        ):
            if arr.shape != (n,):
                raise ValueError(f"difficulty state: questions.{key} has shape {arr.shape}, expected ({n},)")
        if len(set(ids)) != n:
            seen: set = set()
            repeated = next(q for q in ids if q in seen or seen.add(q))
            raise ValueError(f"difficulty state: questions.ids has id {repeated!r} more than once")
        bad = ~np.isfinite(difficulty) | (difficulty < self.config.d_min) | (difficulty > self.config.d_max)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"difficulty state: questions.difficulty[{pos}] = {difficulty[pos]!r} (id {ids[pos]!r}) is outside "
                f"[d_min, d_max] = [{self.config.d_min}, {self.config.d_max}]"
            )
        previous_version = self.version
        self._clear()
        for qid in ids:
            self._slot_for(qid)
        self._difficulty[:n] = difficulty
        self._updates[:n] = updates
        self._last_step[:n] = last_step
        self._last_alpha[:n] = last_alpha
        # Strictly above both the saved and the previous version, so every reader is told to rebuild.
        self.version = max(version, previous_version) + 1
        self._changed_at[:n] = self.version
        self.reset_version = self.version
        self._recent_requests = OrderedDict((r, version) for r in recent)
