"""DIVA-GRPO's additions to GRPO, each removable by config: the identity check and the seed sweep's ablations.

DIVA-GRPO is GRPO (a z-score over each prompt's responses) plus five additions (docs/algo/diva_grpo.md):

* ``variants``: each question also asked as difficulty-matched variants (``diva.variants.variants_per_question``);
  removed, the question's one prompt gets the variants' responses too (the same responses per question);
* ``global_stream``: the z-score over all of a question's prompts (``diva.advantage.global_coef``);
* ``difficulty_weighting``: the global stream scaled by ``exp(k (d - dbar) sign)`` (``diva.advantage.k``);
* ``batch_norm``: each stream standardised over the batch (``diva.advantage.batch_norm``);
* ``rrb``: each stream scaled by its group's reward range (``diva.advantage.rrb``).

With all five removed the DIVA trainer is verl's GRPO (the identity check, ``tests/e2e/test_grpo_identity_on_cpu.py``,
:mod:`verl_ext.checks.grpo_identity`).

Two routes take them: the CPU launcher's Hydra overrides (:func:`addition_overrides`, with the prompts and responses per
prompt set by ``verl_ext.cpu.overrides.method_overrides``) and the GPU launcher's (``run_scripts/qwen25vl7b_diva.sh``,
which ``ROLLOUT=vllm`` goes through): its variables where it has one, Hydra overrides after its own arguments where it
has none (:func:`launcher_ablation`).
"""

from __future__ import annotations

from collections.abc import Iterable

ADDITIONS = ("variants", "global_stream", "difficulty_weighting", "batch_norm", "rrb")
# The Hydra override that removes each addition; ``variants`` changes the prompts per step as well
# (verl_ext.cpu.overrides.method_overrides).
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


# The GPU launcher's variable for an addition's override, where it has one (run_scripts/qwen25vl7b_diva.sh): setting
# the key again as a Hydra override would set it twice.
LAUNCHER_VARIABLE = {"difficulty_weighting": ("DIFFICULTY_K", "0")}


def launcher_ablation(without: Iterable[str], rollout_n: int) -> tuple[dict[str, str], list[str]]:
    """``(variables, overrides)`` that remove ``without`` from a run of the GPU launcher ``qwen25vl7b_diva.sh`` whose
    prompts get ``rollout_n`` responses each with the variants on: its variables (``VARIANTS_PER_QUESTION=0`` with
    ``ROLLOUT_N`` times ``1 + variants_per_question`` (1), so the question's one prompt gets the variants' responses
    too, as :func:`verl_ext.cpu.overrides.method_overrides` does; ``DIFFICULTY_K=0``) and the Hydra overrides it has no
    variable for (``global_coef``, ``batch_norm``, ``rrb``), to follow its own arguments."""
    without = checked_additions(without)
    variables: dict[str, str] = {}
    overrides: list[str] = []
    for name in without:
        if name == "variants":
            variables.update(VARIANTS_PER_QUESTION="0", ROLLOUT_N=str(2 * rollout_n))
        elif name in LAUNCHER_VARIABLE:
            variable, value = LAUNCHER_VARIABLE[name]
            variables[variable] = value
        else:
            overrides.append(REMOVED_BY[name])
    return variables, overrides
