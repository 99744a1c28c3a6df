"""Series of two runs that are equal value for value: drawn, one hides the other, so the report names them.

Two series coincide when they have the same steps, at least :data:`MIN_POINTS` of them, and at every step
``|a - b| <= ATOL + RTOL * max(|a|, |b|)`` (NaN only where the other is NaN too). A series of one point is never
flagged: every run validates the same model before training, so the lone point of a run that has not validated
since is the same for all of them and says nothing.

Within one panel (a quantity: a benchmark, the reward, the collapse rate), series of different runs are compared
pairwise, under any key (NC-GRPO's ``noise_contrastive_grpo/collapse_rate`` can equal GRPO's
``grpo/collapse_rate``); equal pairs are joined into groups (connected components), one :class:`Coincidence` each.
Series of the same run are never compared with each other. Pure numpy: no plotting here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

RTOL = 1e-9
ATOL = 1e-12
MIN_POINTS = 2


def same_series(steps_a, values_a, steps_b, values_b, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Whether ``(steps_a, values_a)`` and ``(steps_b, values_b)`` are equal value for value (module docstring)."""
    steps_a, steps_b = np.asarray(steps_a), np.asarray(steps_b)
    if steps_a.shape != steps_b.shape or steps_a.size < MIN_POINTS or not np.array_equal(steps_a, steps_b):
        return False
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    a, b = a[~nan_a], b[~nan_b]
    with np.errstate(invalid="ignore"):  # inf - inf
        close = (a == b) | (np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b)))
    return bool(close.all())


@dataclass(frozen=True)
class Coincidence:
    """Series of two or more runs in one panel, equal value for value: ``members`` are ``(run, key)`` pairs in the
    order the series were given."""

    panel: str
    members: tuple[tuple[str, str], ...]
    points: int

    @property
    def runs(self) -> list[str]:
        return list(dict.fromkeys(run for run, _ in self.members))

    @property
    def key(self) -> str:
        """The logged key, or ``a = b`` when the runs logged the same values under different keys."""
        return " = ".join(dict.fromkeys(key for _, key in self.members))

    def others(self, run: str) -> list[str]:
        """The runs ``run`` coincides with here."""
        return [r for r in self.runs if r != run]

    def as_dict(self) -> dict:
        return {"panel": self.panel, "key": self.key, "runs": self.runs, "points": self.points}


def find_coincident(series: Iterable[Mapping]) -> list[Coincidence]:
    """Groups of coinciding series. ``series``: ``{"panel", "run", "label", "steps", "values"}`` mappings (the
    entries of ``figures.json``); the groups come in the order of their first series."""
    entries = list(series)
    parent = list(range(len(entries)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(entries):
        for j in range(i + 1, len(entries)):
            b = entries[j]
            if a["panel"] != b["panel"] or a["run"] == b["run"]:
                continue
            if same_series(a["steps"], a["values"], b["steps"], b["values"]):
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(entries)):
        groups.setdefault(root(i), []).append(i)
    found = []
    for members in sorted(groups.values(), key=lambda m: m[0]):
        if len({entries[i]["run"] for i in members}) < 2:
            continue
        first = entries[members[0]]
        found.append(
            Coincidence(
                panel=first["panel"],
                members=tuple((entries[i]["run"], entries[i]["label"]) for i in members),
                points=len(first["steps"]),
            )
        )
    return found


def same_as(found: Iterable[Coincidence]) -> dict[tuple[str, str, str], list[str]]:
    """``{(panel, run, key): [the other runs whose series equals it]}``, for the series' legend entry."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for coincidence in found:
        for run, key in coincidence.members:
            others = out.setdefault((coincidence.panel, run, key), [])
            others += [o for o in coincidence.others(run) if o not in others]
    return out


def notes_by_panel(found: Iterable[Coincidence]) -> dict[tuple[str, str], list[str]]:
    """``{(panel, run): [the other runs it coincides with]}``, for the panel's note ("same as GRPO")."""
    notes: dict[tuple[str, str], list[str]] = {}
    for (panel, run, _), others in same_as(found).items():
        listed = notes.setdefault((panel, run), [])
        listed += [o for o in others if o not in listed]
    return notes


def coincident_configs(curves: Mapping[str, Mapping[int, tuple]]) -> dict[str, list[str]]:
    """For a sweep (``{config: {seed: (steps, values)}}``): ``{config: [the configs whose curve equals it at every
    seed]}``; two configurations coincide when they ran the same seeds and each seed's curves coincide."""
    names = list(curves)
    same: dict[str, list[str]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seeds_a, seeds_b = curves[a], curves[b]
            if not seeds_a or set(seeds_a) != set(seeds_b):
                continue
            if all(same_series(*seeds_a[s], *seeds_b[s]) for s in seeds_a):
                same.setdefault(a, []).append(b)
                same.setdefault(b, []).append(a)
    return same
