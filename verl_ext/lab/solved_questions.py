"""Which questions a run solved: the sparse task's record of the warm start's unsolved validation questions that a
run's final policy solves (:func:`solved_record`, the run's :data:`QUESTIONS_FILE`), read from its last checkpoint
(:func:`final_weights`).
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_ext.lab.sampling import prompts, right_log_prob_parts, sample_answers

# Validation questions are "solved" when one of QUESTION_SAMPLES sampled answers (the rollouts' temperature, the same
# seed at the start and the end) is right: the warm start's unsolved ones and, per run, those its final policy solves.
QUESTION_SAMPLES = 16
QUESTIONS_FILE = "questions.json"


def question_accuracy(model, processor, val_file: str, seed: int = 0) -> list[float]:
    """Per validation question (the originals), the fraction of :data:`QUESTION_SAMPLES` sampled answers that are
    right (seeded from ``seed``: the same draws for every policy measured)."""
    import pandas as pd

    from verl_ext.lab.rl_settings import ROLLOUT_TEMPERATURE

    asked = prompts(pd.read_parquet(val_file), 0)
    n = QUESTION_SAMPLES
    _, _, rewards = sample_answers(model, processor, asked, n, ROLLOUT_TEMPERATURE, seed + 1)
    return [sum(rewards[i * n : (i + 1) * n]) / n for i in range(len(asked))]


def final_weights(run_dir: str | Path) -> Path:
    """The Hugging Face folder of a run's last checkpoint (``checkpoints/global_step_N/actor/huggingface``)."""
    found = sorted(
        Path(run_dir).glob("checkpoints/global_step_*/actor/huggingface/model.safetensors"),
        key=lambda p: int(p.parts[-4].rsplit("_", 1)[1]),
    )
    if not found:
        raise FileNotFoundError(
            f"{run_dir}: no checkpoints/global_step_*/actor/huggingface/model.safetensors (the sparse task's runs "
            "save hf_model: verl_ext.lab.tasks.task_overrides)"
        )
    return found[-1].parent


def solved_record(run_dir: str | Path, warm_start: str, val_file: str, properties: dict, seed: int = 0) -> dict:
    """Which of the warm start's unsolved validation questions (``properties``,
    :func:`verl_ext.lab.sparse_task.task_properties`) the run's final policy solves, written to the run's
    :data:`QUESTIONS_FILE`: ``{"step", "accuracy": per question, "initially_unsolved", "solved", "solved_share",
    "unsolved_right_log_prob": {"start", "end"}, "unsolved_right_log_prob_parts": {"start", "end"}}``, the last two
    the mean log-probability of the right completion on those questions at the warm start and at the end, whole and
    in parts (:func:`~verl_ext.lab.sampling.right_log_prob_parts`): how far the run moved the questions it could not
    yet solve, and which part it moved, which accuracy at 16 samples cannot see below about 1/16. ``val_file``: the
    task's validation questions (not a views file)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    weights = final_weights(run_dir)
    processor = AutoProcessor.from_pretrained(warm_start)  # the run's own processor: the warm start's
    unsolved = list(properties["validation_unsolved"])
    hard = [p for i, p in enumerate(prompts(pd.read_parquet(val_file), 0)) if i in set(unsolved)]
    parts = {}
    for when, folder in (("start", warm_start), ("end", weights)):
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        parts[when] = right_log_prob_parts(model, processor, hard) if hard else None
    accuracy = question_accuracy(model, processor, val_file, seed=seed)  # the final policy's
    solved = [i for i in unsolved if accuracy[i] > 0]
    record = {
        "step": int(weights.parts[-3].rsplit("_", 1)[1]),
        "accuracy": accuracy,
        "initially_unsolved": unsolved,
        "solved": solved,
        "solved_share": len(solved) / len(unsolved) if unsolved else None,
        "unsolved_right_log_prob": {when: p["total"] if p else None for when, p in parts.items()},
        "unsolved_right_log_prob_parts": parts,
    }
    (Path(run_dir) / QUESTIONS_FILE).write_text(json.dumps(record))
    return record
