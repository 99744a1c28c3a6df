"""Variant planners: which variant each slot of a question gets, from the question's difficulty.

A planner is a pure function

    plans = planner(difficulty, num_variants, rng, features, variants_cfg, difficulty_cfg)

returning one :class:`VariantPlan` per variant slot ``1..num_variants`` (slot 0 is always the
original). ``rng`` is a ``np.random.Generator`` seeded per (seed, epoch, question id), so the slots of
a question are planned together (they can differ from one another) and every draw is reproducible;
the worker that builds slot ``j`` recomputes the same list and takes entry ``j - 1``. High D = hard.
A variant's difficulty is ``clip(D + shift, d_min, d_max)`` (:meth:`VariantPlan.difficulty`).

``paper`` (the default; docs/algo/diva_grpo.md) moves each variant towards the middle difficulty
``mid = (d_min + d_max) / 2``, where the paper says the optimisation signal is strongest:

=================================  =================================================================
``r = round(D)``                   variant of slot ``j`` (of ``m``); ``step = j / m``
=================================  =================================================================
``r < mid - 1`` (easy)             one image perturbation, kinds spread over the slots (a shuffled
                                   pool: Gaussian noise, rotation, salt-and-pepper, speckle, blur, low
                                   resolution, question-in-image when the row allows it); strength
                                   ``t = step * (mid - D) / (mid - d_min)`` interpolates each kind's
                                   range; a paraphrase replaces the text with probability 1/2;
                                   ``shift = step * (mid - D)``
``|r - mid| <= 1`` (middling)      paraphrase (distinct paraphrases over the slots), ``shift = 0``
``r > mid + 1`` (hard)             reasoning hint: the first ``ceil(f * S)`` of the ``S`` stored
                                   steps, ``f = step * (D - mid) / (d_max - mid)`` (more steps for
                                   harder questions); ``shift = -step * (D - mid)``
=================================  =================================================================

``released`` follows the authors' code (docs/algo/diva_grpo.md, fidelity): slot 1 takes the shift of the table
``D -> shift`` = 1:+8, 2:+6, 3:+4, 4:+2, 5:+1, 6:-1, 7:-2, 8:-3, 9:-5 (``D`` rounded, clipped to 1..9);
further slots draw ``round(N(shift, 1))`` clipped to [-8, 8]. A shift then maps to a variant:

============  ====================================================================================
shift         variant
============  ====================================================================================
-1, -2        hint with the first step; -3, -4: two steps; -5, -6: three; <= -7: all steps
0             paraphrase
+1, +2        one transform: Gaussian noise (sigma in ``noise_sigma``) or rotation (the prompt states
              the angle)
+3, +4        two combined transforms from {rotation, Gaussian noise, salt-and-pepper, blur}
+5, +6        three combined transforms from the same set
+7, +8        the question rendered into a white band of the image (prompt: "answer the question in
              the image"); rows that do not allow it fall back to three combined transforms
============  ====================================================================================

Image variants keep the question text or, with probability 1/2 when the row has paraphrases, a
paraphrase. Transform strengths are uniform in each kind's range (:data:`STRENGTH_RANGES`).

Feasibility and fallbacks: a kind the row cannot support (no decodable image, no stored hint steps,
no paraphrases, question-in-image not allowed) is replaced by the first feasible kind of the chain
below, and the plan records ``fallback = "<planned>-><used>:<reason>"`` so the trainer can count it.
When no kind is feasible the planner raises ``ValueError`` (the dataset adds the question id).

    harder (image_perturb, text_in_image):  text_in_image -> image_perturb -> paraphrase -> hint
    same (paraphrase):                      paraphrase -> image_perturb (D < mid) or hint (D >= mid) -> the other
    easier (hint):                          hint -> paraphrase -> image_perturb

A fallback in the same direction keeps the planned shift; a paraphrase fallback has shift 0, an image
fallback one mild transform with shift +1, a hint fallback the first step with shift -1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from verl_ext.config import DifficultyConfig, VariantConfig

ORIGINAL = "original"
PARAPHRASE = "paraphrase"
HINT = "hint"
IMAGE_PERTURB = "image_perturb"
TEXT_IN_IMAGE = "text_in_image"
VARIANT_KINDS = (ORIGINAL, PARAPHRASE, HINT, IMAGE_PERTURB, TEXT_IN_IMAGE)

# Strength range (low, high) of each single-image transform; the planners pick a value inside it.
# gaussian_noise and rotate take theirs from VariantConfig (noise_sigma, rotation_degrees).
STRENGTH_RANGES: dict[str, tuple[str, tuple[float, float]]] = {
    "salt_pepper": ("amount", (0.05, 0.15)),
    "speckle": ("sigma", (0.30, 0.60)),
    "blur": ("radius_frac", (0.004, 0.012)),
    "low_resolution": ("reduction", (0.60, 0.85)),
}
PAPER_TRANSFORMS = ("gaussian_noise", "rotate", "salt_pepper", "speckle", "blur", "low_resolution")
RELEASED_SINGLE = ("gaussian_noise", "rotate")
RELEASED_COMBINABLE = ("rotate", "gaussian_noise", "salt_pepper", "blur")
RELEASED_SHIFT = {1: 8, 2: 6, 3: 4, 4: 2, 5: 1, 6: -1, 7: -2, 8: -3, 9: -5}
TEXT_BAND_FONT_FRAC = 0.025


@dataclass(frozen=True)
class RowFeatures:
    """What a question row can support (the planner's only view of the data)."""

    num_images: int
    images_decodable: bool
    num_paraphrases: int
    num_hint_steps: int
    text_in_image: bool

    def why_not(self, kind: str) -> str | None:
        """``None`` if ``kind`` is feasible for this row, else a short reason."""
        if kind in (IMAGE_PERTURB, TEXT_IN_IMAGE):
            if self.num_images == 0:
                return "no_images"
            if not self.images_decodable:
                return "image_undecodable"
            if kind == TEXT_IN_IMAGE and not self.text_in_image:
                return "text_in_image_not_allowed"
        elif kind == PARAPHRASE and self.num_paraphrases == 0:
            return "no_paraphrases"
        elif kind == HINT and self.num_hint_steps == 0:
            return "no_hint_steps"
        return None


@dataclass(frozen=True)
class VariantPlan:
    """One variant: how the prompt and images of the original are changed.

    ``perturbations`` is applied to every image in order (``text_band`` only to the first one);
    its params are complete (random ones carry their own ``seed``), so the record replays exactly.
    """

    kind: str
    shift: float = 0.0
    paraphrase_index: int = -1
    hint_steps: int = 0
    perturbations: tuple[tuple[str, dict[str, Any]], ...] = ()
    fallback: str = ""
    planner: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def difficulty(self, question_difficulty: float, d_min: float, d_max: float) -> float:
        return float(min(max(question_difficulty + self.shift, d_min), d_max))

    @property
    def perturbation_name(self) -> str:
        return "+".join(name for name, _ in self.perturbations) or "none"

    @property
    def rotation_degrees(self) -> float | None:
        for name, params in self.perturbations:
            if name == "rotate":
                return float(params["degrees"])
        return None

    def record(self) -> dict[str, Any]:
        """JSON-serialisable audit record (everything needed to rebuild the variant from its row)."""
        return {
            "planner": self.planner,
            "kind": self.kind,
            "shift": self.shift,
            "paraphrase_index": self.paraphrase_index,
            "hint_steps": self.hint_steps,
            "perturbations": [{"name": name, "params": params} for name, params in self.perturbations],
            "fallback": self.fallback,
            **self.extra,
        }


ORIGINAL_PLAN = VariantPlan(kind=ORIGINAL)


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


def transform_params(name: str, strength: float, rng: np.random.Generator, cfg: VariantConfig) -> dict[str, Any]:
    """Concrete params of one transform at ``strength`` in [0, 1] of its range (random seeds drawn from rng)."""
    if name == "gaussian_noise":
        low, high = cfg.noise_sigma
        return {"sigma": round(low + strength * (high - low), 4), "seed": _seed(rng)}
    if name == "rotate":
        low, high = cfg.rotation_degrees
        sign = 1 if rng.random() < 0.5 else -1
        # Whole degrees, so the angle stated in the prompt is exactly the angle applied.
        return {"degrees": float(sign * max(1, round(low + strength * (high - low))))}
    param, (low, high) = STRENGTH_RANGES[name]
    params: dict[str, Any] = {param: round(low + strength * (high - low), 4)}
    if name in ("salt_pepper", "speckle"):
        params["seed"] = _seed(rng)
    return params


def _round_half_up(value: float) -> int:
    """Difficulty level of ``value`` (4.5 -> 5), as the difficulty metrics count levels; Python's round is banker's."""
    return math.floor(value + 0.5)


def _hint_steps_for_fraction(fraction: float, available: int) -> int:
    return max(1, min(available, math.ceil(fraction * available - 1e-9)))


def _released_hint_steps(shift: float, available: int) -> int:
    if shift <= -7:
        wanted = available
    elif shift <= -5:
        wanted = 3
    elif shift <= -3:
        wanted = 2
    else:
        wanted = 1
    return max(1, min(available, wanted))


def _maybe_paraphrase(rng: np.random.Generator, features: RowFeatures) -> int:
    """A paraphrase index with probability 1/2 when the row has paraphrases, else -1 (keep the question)."""
    coin = rng.random()
    if features.num_paraphrases and coin < 0.5:
        return int(rng.integers(features.num_paraphrases))
    return -1


def _fallback_chain(planned: str, difficulty: float, mid: float) -> tuple[str, ...]:
    if planned == TEXT_IN_IMAGE:
        return (TEXT_IN_IMAGE, IMAGE_PERTURB, PARAPHRASE, HINT)
    if planned == IMAGE_PERTURB:
        return (IMAGE_PERTURB, PARAPHRASE, HINT)
    if planned == HINT:
        return (HINT, PARAPHRASE, IMAGE_PERTURB)
    if planned == PARAPHRASE:
        return (PARAPHRASE, IMAGE_PERTURB, HINT) if difficulty < mid else (PARAPHRASE, HINT, IMAGE_PERTURB)
    raise ValueError(f"cannot plan variant kind {planned!r}; kinds: {VARIANT_KINDS[1:]}")


def resolve_kind(planned: str, difficulty: float, mid: float, features: RowFeatures) -> tuple[str, str]:
    """First feasible kind of ``planned``'s fallback chain, and the fallback record ("" if none)."""
    chain = _fallback_chain(planned, difficulty, mid)
    reason = features.why_not(planned)
    for kind in chain:
        if features.why_not(kind) is None:
            return kind, ("" if kind == planned else f"{planned}->{kind}:{reason}")
    raise ValueError(
        f"no variant kind is feasible (tried {list(chain)}: {[features.why_not(k) for k in chain]}); "
        "give the row paraphrases or hint_steps (diva-prep), or a decodable image"
    )


def _fallback_plan(kind: str, rng: np.random.Generator, features: RowFeatures, cfg: VariantConfig) -> VariantPlan:
    """The mild variant of ``kind`` used when the planned kind points the other way."""
    if kind == PARAPHRASE:
        return VariantPlan(kind=PARAPHRASE, shift=0.0, paraphrase_index=int(rng.integers(features.num_paraphrases)))
    if kind == HINT:
        return VariantPlan(kind=HINT, shift=-1.0, hint_steps=1)
    name = PAPER_TRANSFORMS[int(rng.integers(len(PAPER_TRANSFORMS)))]
    return VariantPlan(kind=IMAGE_PERTURB, shift=1.0, perturbations=((name, transform_params(name, 0.0, rng, cfg)),))


def _text_band(position_rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
    position = "top" if position_rng.random() < 0.5 else "bottom"
    # The text itself is filled in by the dataset (the question or the chosen paraphrase).
    return ("text_band", {"position": position, "font_frac": TEXT_BAND_FONT_FRAC})


def plan_paper(
    difficulty: float,
    num_variants: int,
    rng: np.random.Generator,
    features: RowFeatures,
    cfg: VariantConfig,
    difficulty_cfg: DifficultyConfig,
) -> list[VariantPlan]:
    """The paper's three-tier policy (module docstring): easy -> image, middling -> paraphrase, hard -> hint."""
    d_min, d_max = difficulty_cfg.d_min, difficulty_cfg.d_max
    mid = (d_min + d_max) / 2
    rounded = min(max(_round_half_up(difficulty), d_min), d_max)
    if rounded < mid - 1:
        planned = IMAGE_PERTURB
    elif rounded > mid + 1:
        planned = HINT
    else:
        planned = PARAPHRASE

    pool = list(PAPER_TRANSFORMS) + ([TEXT_IN_IMAGE] if features.why_not(TEXT_IN_IMAGE) is None else [])
    pool_order = [pool[i] for i in rng.permutation(len(pool))]
    paraphrase_order = [int(i) for i in rng.permutation(max(1, features.num_paraphrases))]

    plans = []
    for slot in range(1, num_variants + 1):
        step = slot / num_variants
        kind, fallback = resolve_kind(planned, difficulty, mid, features)
        if kind != planned:
            plan = _fallback_plan(kind, rng, features, cfg)
        elif kind == IMAGE_PERTURB:
            strength = step * min(1.0, max(0.0, (mid - difficulty) / (mid - d_min)))
            name = pool_order[(slot - 1) % len(pool_order)]
            paraphrase = _maybe_paraphrase(rng, features)
            if name == TEXT_IN_IMAGE:
                plan = VariantPlan(TEXT_IN_IMAGE, paraphrase_index=paraphrase, perturbations=(_text_band(rng),))
            else:
                perturbation = (name, transform_params(name, strength, rng, cfg))
                plan = VariantPlan(IMAGE_PERTURB, paraphrase_index=paraphrase, perturbations=(perturbation,))
            plan = _with(plan, shift=step * (mid - difficulty), extra={"strength": round(strength, 4)})
        elif kind == PARAPHRASE:
            index = paraphrase_order[(slot - 1) % len(paraphrase_order)]
            plan = VariantPlan(PARAPHRASE, shift=0.0, paraphrase_index=index)
        else:  # HINT
            fraction = step * min(1.0, max(0.0, (difficulty - mid) / (d_max - mid)))
            steps = _hint_steps_for_fraction(fraction, features.num_hint_steps)
            plan = VariantPlan(HINT, shift=-step * (difficulty - mid), hint_steps=steps)
        plans.append(_with(plan, fallback=fallback, planner="paper"))
    return plans


def _released_shift_variant(
    shift: int, rng: np.random.Generator, features: RowFeatures, cfg: VariantConfig
) -> tuple[str, VariantPlan]:
    """(planned kind, plan) for one released-table shift, before feasibility checks."""
    if shift < 0:
        steps = _released_hint_steps(shift, max(1, features.num_hint_steps))
        return HINT, VariantPlan(HINT, shift=float(shift), hint_steps=steps)
    if shift == 0:
        return PARAPHRASE, VariantPlan(PARAPHRASE, paraphrase_index=int(rng.integers(max(1, features.num_paraphrases))))
    paraphrase = _maybe_paraphrase(rng, features)
    if shift >= 7 and features.why_not(TEXT_IN_IMAGE) is None:
        return TEXT_IN_IMAGE, VariantPlan(
            TEXT_IN_IMAGE, shift=float(shift), paraphrase_index=paraphrase, perturbations=(_text_band(rng),)
        )
    if shift <= 2:
        names = [RELEASED_SINGLE[int(rng.integers(len(RELEASED_SINGLE)))]]
    else:
        count = 2 if shift <= 4 else 3
        names = [RELEASED_COMBINABLE[i] for i in rng.choice(len(RELEASED_COMBINABLE), size=count, replace=False)]
    perturbations = tuple((name, transform_params(name, float(rng.random()), rng, cfg)) for name in names)
    planned = TEXT_IN_IMAGE if shift >= 7 else IMAGE_PERTURB
    plan = VariantPlan(IMAGE_PERTURB, shift=float(shift), paraphrase_index=paraphrase, perturbations=perturbations)
    return planned, plan


def plan_released(
    difficulty: float,
    num_variants: int,
    rng: np.random.Generator,
    features: RowFeatures,
    cfg: VariantConfig,
    difficulty_cfg: DifficultyConfig,
) -> list[VariantPlan]:
    """The authors' released table (module docstring)."""
    mid = (difficulty_cfg.d_min + difficulty_cfg.d_max) / 2
    table_shift = RELEASED_SHIFT[int(min(max(_round_half_up(difficulty), 1), 9))]
    plans = []
    for slot in range(1, num_variants + 1):
        shift = table_shift if slot == 1 else int(np.clip(round(rng.normal(table_shift, 1.0)), -8, 8))
        planned, plan = _released_shift_variant(shift, rng, features, cfg)
        if planned == TEXT_IN_IMAGE and plan.kind != TEXT_IN_IMAGE:
            # Question-in-image not allowed: same direction, three combined transforms (kept shift).
            fallback = f"{TEXT_IN_IMAGE}->{IMAGE_PERTURB}:{features.why_not(TEXT_IN_IMAGE)}"
            if features.why_not(IMAGE_PERTURB) is None:
                plans.append(_with(plan, fallback=fallback, planner="released", extra={"table_shift": table_shift}))
                continue
        kind, fallback = resolve_kind(planned, difficulty, mid, features)
        if kind != planned and not (planned == TEXT_IN_IMAGE and kind == IMAGE_PERTURB):
            plan = _fallback_plan(kind, rng, features, cfg)
        plans.append(_with(plan, fallback=fallback, planner="released", extra={"table_shift": table_shift}))
    return plans


def _with(plan: VariantPlan, **changes: Any) -> VariantPlan:
    if "extra" in changes:
        changes["extra"] = {**plan.extra, **changes["extra"]}
    return replace(plan, **changes)


Planner = Callable[[float, int, np.random.Generator, RowFeatures, VariantConfig, DifficultyConfig], list[VariantPlan]]
PLANNERS: dict[str, Planner] = {"paper": plan_paper, "released": plan_released}


def get_planner(name: str) -> Planner:
    try:
        return PLANNERS[name]
    except KeyError:
        raise ValueError(f"diva.variants.planner={name!r} is unknown; choose one of {sorted(PLANNERS)}") from None
