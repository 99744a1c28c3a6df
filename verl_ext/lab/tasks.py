"""The lab's tasks, each a warm start and its data: ``swatch`` (:func:`prepare_swatch`: the tiny Qwen2-VL supervised
into a base policy that half-solves ``diva-prep swatch`` questions) and ``sparse`` (hard questions with solvable hints,
:mod:`verl_ext.lab.sparse_task`), with what their runs add to the common settings (:func:`task_overrides`).
"""

from __future__ import annotations

# The learnable task (data_prep.swatch): 64 validation questions (10 points of accuracy are 6-7 questions), and 8
# training questions, all of them in every step (QUESTIONS_PER_STEP), so that DIVA plans from a moved difficulty
# table from the second step on (at first every question is at d_init, and middling questions get paraphrases) and
# the zero-advantage fraction moves in eighths, not quarters.
SWATCH_TRAIN_QUESTIONS = 8
SWATCH_VAL_QUESTIONS = 64
QUESTIONS_PER_STEP = 8
SWATCH_RESPONSE_LENGTH = 32  # "<think>yellow</think>\boxed{4}" and the end token fit


def prepare_swatch(workdir: str, seed: int = 0) -> dict:
    """The learnable CPU task: the tiny model warm-started (:mod:`verl_ext.lab.warm_start`) into a base policy that
    half-solves ``diva-prep swatch`` questions, under ``workdir`` (reused when present). Returns the paths
    (``model`` is the warm-started one) and ``warm_start`` (its state: validation accuracy, steps)."""
    from verl_ext.lab.warm_start import prepare_warm_started

    return prepare_warm_started(
        workdir,
        seed,
        model_folder=f"warm_start_seed{seed}",
        data_name="swatch",
        train_questions=SWATCH_TRAIN_QUESTIONS,
        val_questions=SWATCH_VAL_QUESTIONS,
    )


TASKS = ("swatch", "sparse")


def prepare_task(task: str, workdir: str, seed: int = 0) -> dict:
    """The task's warm start and data under ``workdir``: ``swatch`` (:func:`prepare_swatch`) or ``sparse``
    (:func:`verl_ext.lab.sparse_task.prepare_sparse`: hard questions with solvable hints, its three properties
    measured)."""
    if task == "swatch":
        return prepare_swatch(workdir, seed=seed)
    if task == "sparse":
        from verl_ext.lab.sparse_task import prepare_sparse

        return prepare_sparse(workdir, seed=seed)
    raise ValueError(f"TASK must be one of {list(TASKS)}, got {task!r}")


def task_overrides(task: str) -> tuple[str, ...]:
    """Hydra overrides a task's runs add: the sparse task keeps the final weights as a Hugging Face folder, which
    :func:`verl_ext.lab.sparse_task.question_accuracy` reads for the questions each run solved."""
    return (
        ("actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",)
        if task == "sparse"
        else ()
    )


def announce_task(task: str, paths: dict, tag: str) -> None:
    """Print the warm start's accuracy and, for the sparse task, its three properties."""
    print(f"[{tag}] {task} task, warm start: validation accuracy {paths['warm_start']['val_accuracy']:.3f}", flush=True)
    if "properties" in paths:
        from verl_ext.lab.sparse_task import property_lines

        for line in property_lines(paths["properties"]):
            print(line, flush=True)
