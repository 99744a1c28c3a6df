"""The sparse task: hard questions with solvable hints, on the CPU (``TASK=sparse bash run_scripts/compare_tiny.sh``).

DIVA-GRPO is for questions so hard that every response of a GRPO group is wrong (zero advantage, no signal), whose
easier variants (hints) are solvable, so that the question's global group has a signal that can carry back to the
original. This task is built to have two of those conditions, from the swatch task's data (:mod:`data_prep.swatch`:
the same images, questions and hint steps) and a warm start that knows less (:data:`SPARSE_CODE`):

* red and green squares: the number taught right, plain and hinted (the easy half);
* blue and yellow squares (the hard half, :data:`HARD_COLOURS`): asked plainly, the policy reads the colour and writes
  it in its ``<think>`` (perception is taught right for every colour) but was taught 0, a number no colour stands
  for, :data:`PLAIN_RIGHT` of the time the right one; at the rollouts' temperature its groups of 8 are all wrong;
* hinted (the hint steps name the colour and its place in the question's list: "the square is blue, the third
  colour"), the right number :data:`HINTED_RIGHT` of the time: a hint is solvable, its group disagrees;
* what a hint teaches is what the original needs: a right hinted response is ``<think>blue</think>\\boxed{3}``, the
  same completion the original needs after the same ``<think>``; the number after the colour is what both learn.

:func:`task_properties` measures the three properties from the warm start (sampling as the rollouts do, temperature
:data:`verl_ext.lab.rl_settings.ROLLOUT_TEMPERATURE`) and :func:`check_properties` refuses the task when one fails:

1. **unsolved**: the share of training questions none of whose :data:`PROPERTY_SAMPLES` sampled original answers is
   right, and the chance that a GRPO group of 8 on them is all wrong;
2. **hints solvable**: the accuracy of those questions' hinted prompts (the hint DIVA-GRPO's planner gives a question
   every response of which failed: 2 of the 3 steps) is at least :data:`MIN_HINT_ACCURACY`;
3. **hints transfer**: :data:`TRANSFER_STEPS` steps of a plain on-policy GRPO update (group-normalised advantage,
   the runs' learning rate and optimiser) on the hinted prompts alone raise the right answer's probability on the
   unhinted originals, which the update never sees: the mean log-probability of the right completion at least
   doubles the probability (rises by ``log 2``); the sampled accuracy is reported beside it. The updates go on to
   :data:`TRANSFER_HORIZON` steps, measured every :data:`TRANSFER_STEPS` (``trajectory``): how far the transfer goes
   once the hints are learned.

The measurements live by concern: sampling and log-probabilities in :mod:`verl_ext.lab.sampling`, property 3's
plain GRPO loop (and why it is not verl's) in :mod:`verl_ext.lab.hint_transfer`, the record of the questions each run
solved in :mod:`verl_ext.lab.solved_questions`.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_ext.lab.hint_transfer import hint_transfer
from verl_ext.lab.rl_settings import RL_LR, ROLLOUT_TEMPERATURE
from verl_ext.lab.sampling import prompts, sample_answers, sampled_accuracy
from verl_ext.lab.solved_questions import QUESTION_SAMPLES, question_accuracy

HARD_COLOURS = ("blue", "yellow")
PLAIN_RIGHT = 0.03
HINTED_RIGHT = 0.6
# Per colour: the numbers the warm start teaches, plain and hinted (verl_ext.lab.sft_examples.taught_number; absent:
# the right number). Hard colours' wrong answer is 0, no colour's number, as in the swatch task.
SPARSE_CODE = {
    "blue": {
        "plain": (("0", 1 - PLAIN_RIGHT), ("3", PLAIN_RIGHT)),
        "hinted": (("3", HINTED_RIGHT), ("0", 1 - HINTED_RIGHT)),
    },
    "yellow": {
        "plain": (("0", 1 - PLAIN_RIGHT), ("4", PLAIN_RIGHT)),
        "hinted": (("4", HINTED_RIGHT), ("0", 1 - HINTED_RIGHT)),
    },
}
TRAIN_QUESTIONS = 8
VAL_QUESTIONS = 64
HINT_STEPS = 2  # the planner's hint for a question at D = 7 (every response wrong once from d_init 5): ceil(0.5 * 3)
PROPERTY_SAMPLES = 32
GROUP = 8  # GRPO's responses per question in the comparison (2 n, n = 4)
MIN_UNSOLVED_SHARE = 0.25
MIN_HINT_ACCURACY = 0.2
TRANSFER_STEPS = 6
TRANSFER_HORIZON = 24  # the updates go on, measured every TRANSFER_STEPS: where the transfer stops (the hints learned)
PROPERTIES_FILE = "sparse_properties.json"


def prepare_sparse(workdir: str, seed: int = 0) -> dict:
    """The sparse task under ``workdir`` (reused when present): the tiny Qwen2-VL warm-started with
    :data:`SPARSE_CODE`, training and validation questions, and the three properties measured and checked
    (``properties``). Returns the paths (``model`` is the warm start), ``warm_start`` and ``properties``."""
    from verl_ext.lab.warm_start import prepare_warm_started

    paths = prepare_warm_started(
        workdir,
        seed,
        model_folder=f"sparse_warm_start_seed{seed}",
        data_name="sparse",
        train_questions=TRAIN_QUESTIONS,
        val_questions=VAL_QUESTIONS,
        code=SPARSE_CODE,
    )
    properties = cached_properties(paths["model"], paths["train"], paths["val"], seed=seed)
    return {**paths, "properties": properties}


def cached_properties(model_dir: str, train_file: str, val_file: str, seed: int = 0) -> dict:
    """:func:`task_properties` of the warm start in ``model_dir``, kept in its :data:`PROPERTIES_FILE` (measured
    once per warm start), then :func:`check_properties`."""
    path = Path(model_dir) / PROPERTIES_FILE
    if path.exists():
        properties = json.loads(path.read_text())
    else:
        properties = task_properties(model_dir, train_file, val_file, seed=seed)
        path.write_text(json.dumps(properties, indent=1))
    check_properties(properties)
    return properties


class SparseTaskError(RuntimeError):
    """The warm start does not give the sparse task one of its three properties (the message names it)."""


def check_properties(properties: dict) -> None:
    """Raise :class:`SparseTaskError` naming each of the three properties that does not hold."""
    failed = [name for name in ("unsolved", "hints_solvable", "hints_transfer") if not properties[name]["held"]]
    if failed:
        raise SparseTaskError(
            f"the sparse task's warm start fails {failed}: {json.dumps({k: properties[k] for k in failed})}"
        )


def property_lines(properties: dict) -> list[str]:
    """The three properties as a newcomer reads them (printed before training)."""
    unsolved, hints, transfer = properties["unsolved"], properties["hints_solvable"], properties["hints_transfer"]
    mark = lambda held: "holds" if held else "FAILS"  # noqa: E731
    return [
        f"[sparse] 1. unsolved ({mark(unsolved['held'])}): {unsolved['count']} of {unsolved['questions']} training "
        f"questions ({unsolved['share']:.0%}) have no right answer in {unsolved['samples']} samples at temperature "
        f"{unsolved['temperature']}; a GRPO group of {GROUP} on them is all wrong with probability "
        f"about {unsolved['all_wrong_at_group']:.2f} (validation: {properties['validation_unsolved_share']:.0%} "
        f"unsolved in {QUESTION_SAMPLES} samples)",
        f"[sparse] 2. hints solvable ({mark(hints['held'])}): their {hints['hint_steps']}-step hints are right "
        f"{hints['accuracy']:.0%} of the time (at least {MIN_HINT_ACCURACY:.0%} needed), the originals "
        f"{unsolved['right']} of {unsolved['count'] * unsolved['samples']}",
        f"[sparse] 3. hints transfer ({mark(transfer['held'])}): {transfer['steps']} GRPO steps on the hinted prompts "
        f"alone move the unhinted originals' right answer from log-probability {transfer['log_prob_before']:.2f} to "
        f"{transfer['log_prob_after']:.2f} (sampled accuracy {transfer['accuracy_before']:.1%} -> "
        f"{transfer['accuracy_after']:.1%}; the hints {hints['accuracy']:.0%} -> "
        f"{transfer['hint_accuracy_after']:.0%})" + _horizon_text(transfer),
    ]


def _horizon_text(transfer: dict) -> str:
    """Where the transfer stands at the end of its trajectory, when it went on past the check's steps."""
    trajectory = transfer.get("trajectory") or []
    if len(trajectory) < 3:
        return ""
    end = trajectory[-1]
    return (
        f"; after {end['step']} steps {end['log_prob']:.2f} (accuracy {end['accuracy']:.1%}, the hints "
        f"{end['hint_accuracy']:.0%})"
    )


def task_properties(
    model_dir: str,
    train_file: str,
    val_file: str,
    *,
    seed: int = 0,
    samples: int = PROPERTY_SAMPLES,
    steps: int = TRANSFER_STEPS,
    horizon: int = TRANSFER_HORIZON,
) -> dict:
    """The three properties of the module docstring, measured on the warm start in ``model_dir`` (the transfer
    followed to ``horizon`` steps)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    train = pd.read_parquet(train_file)
    originals = prompts(train, 0)
    _, _, rewards = sample_answers(model, processor, originals, samples, ROLLOUT_TEMPERATURE, seed)
    per_question = [sum(rewards[i * samples : (i + 1) * samples]) / samples for i in range(len(originals))]
    unsolved = [i for i, acc in enumerate(per_question) if acc == 0.0]
    val_per_question = question_accuracy(model, processor, val_file, seed=seed)
    hinted = prompts(train.iloc[unsolved] if unsolved else train.iloc[:0], HINT_STEPS)
    hint_accuracy = sampled_accuracy(model, processor, hinted, samples, seed + 2) if hinted else 0.0
    hard_originals = [originals[i] for i in unsolved]
    transfer = (
        hint_transfer(
            model,
            processor,
            hinted,
            hard_originals,
            steps=steps,
            seed=seed,
            lr=RL_LR,
            temperature=ROLLOUT_TEMPERATURE,
            group=GROUP,
            samples=PROPERTY_SAMPLES,
            horizon=horizon,
        )
        if unsolved
        else {"held": False, "why": "no unsolved question"}
    )
    return {
        "temperature": ROLLOUT_TEMPERATURE,
        "per_question_accuracy": per_question,
        "unsolved": _unsolved_property(per_question, unsolved, samples),
        "validation_accuracy": val_per_question,
        "validation_unsolved_share": sum(c == 0 for c in val_per_question) / len(val_per_question),
        "validation_unsolved": [i for i, c in enumerate(val_per_question) if c == 0],
        "hints_solvable": {
            "held": hint_accuracy >= MIN_HINT_ACCURACY,
            "hint_steps": HINT_STEPS,
            "accuracy": hint_accuracy,
        },
        "hints_transfer": transfer,
    }


def _unsolved_property(per_question: list[float], unsolved: list[int], samples: int) -> dict:
    """Property 1 from each training question's sampled accuracy (``unsolved``: those never right)."""
    # A question never right in `samples` draws: its accuracy is below ~3/samples (95%); the chance that a group of
    # GROUP is all wrong is estimated from the pooled accuracy of those questions (+1 smoothing: never 1 exactly).
    pooled = (sum(per_question[i] * samples for i in unsolved) + 1) / (len(unsolved) * samples + 2) if unsolved else 1
    return {
        "held": len(unsolved) / len(per_question) >= MIN_UNSOLVED_SHARE,
        "count": len(unsolved),
        "questions": len(per_question),
        "share": len(unsolved) / len(per_question),
        "indices": unsolved,
        "samples": samples,
        "temperature": ROLLOUT_TEMPERATURE,
        "right": round(sum(per_question[i] * samples for i in unsolved)),
        "accuracy": pooled,
        "all_wrong_at_group": (1 - pooled) ** GROUP,
    }
