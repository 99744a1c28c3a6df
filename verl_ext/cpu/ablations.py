"""DIVA-GRPO's additions to GRPO, each removable by config: the identity check and the seed sweep's ablations.

DIVA-GRPO is GRPO (a z-score over each prompt's responses) plus five additions (DESIGN.md section 3):

* ``variants``: each question also asked as difficulty-matched variants (``diva.variants.variants_per_question``);
  removed, the question's one prompt gets the variants' responses too (the same responses per question);
* ``global_stream``: the z-score over all of a question's prompts (``diva.advantage.global_coef``);
* ``difficulty_weighting``: the global stream scaled by ``exp(k (d - dbar) sign)`` (``diva.advantage.k``);
* ``batch_norm``: each stream standardised over the batch (``diva.advantage.batch_norm``);
* ``rrb``: each stream scaled by its group's reward range (``diva.advantage.rrb``).

With all five removed the DIVA trainer is verl's GRPO (the identity check, ``tests/e2e/test_grpo_identity_on_cpu.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

ADDITIONS = ("variants", "global_stream", "difficulty_weighting", "batch_norm", "rrb")
# The Hydra override that removes each addition; ``variants`` changes the prompts per step as well
# (verl_ext.cpu.launch.method_overrides).
REMOVED_BY = {
    "variants": "diva.variants.variants_per_question=0",
    "global_stream": "diva.advantage.global_coef=0",
    "difficulty_weighting": "diva.advantage.k=0",
    "batch_norm": "diva.advantage.batch_norm=false",
    "rrb": "diva.advantage.rrb=false",
}


def checked_additions(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` in :data:`ADDITIONS` order, each once; ``all`` stands for all five. An unknown name raises naming
    the known ones."""
    names = tuple(names)
    if "all" in names:
        names = ADDITIONS
    unknown = sorted(set(names) - set(ADDITIONS))
    if unknown:
        raise ValueError(f"unknown DIVA-GRPO addition(s) {unknown}: expected some of {list(ADDITIONS)} or 'all'")
    return tuple(name for name in ADDITIONS if name in names)


def addition_overrides(without: Iterable[str]) -> list[str]:
    """The advantage overrides that remove ``without`` (``variants`` is the launcher's: it sets the prompts and
    responses per prompt too)."""
    return [REMOVED_BY[name] for name in checked_additions(without) if name != "variants"]
