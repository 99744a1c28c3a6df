"""Training batches of chosen questions, for methods whose planner picks what to roll out (CoDaPO's resampling).

verl's ``_fetch_one_gen_batch`` turns a dataloader batch into a ``TensorDict``; :func:`batch_of_questions` builds
the same thing from the dataset rows of named questions (the trainer then sets the uids of both), so the rest of the
step (rollout, TransferQueue, ReplayBuffer) cannot tell the difference. Questions are named by the stable
``extra_info.question_id`` of the parquet (never by ``uid``, which is new every step).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn

# dataset -> {question_id: row}, built once per dataset object (reading one column of the parquet).
_ROW_OF_QUESTION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def question_rows(dataset) -> dict:
    """``{extra_info.question_id: dataset index}`` of a verl ``RLHFDataset`` (after its length filter)."""
    rows = _ROW_OF_QUESTION.get(dataset)
    if rows is None:
        infos = dataset.dataframe["extra_info"]
        rows = {}
        for i, info in enumerate(infos):
            qid = info.get("question_id") if isinstance(info, dict) else None
            if qid is None:
                raise KeyError(
                    f"row {i} of the training data has no extra_info.question_id; a batch planner names questions "
                    "by it (diva-prep convert writes one for every row)"
                )
            rows.setdefault(qid, i)
        _ROW_OF_QUESTION[dataset] = rows
    return rows


def batch_of_questions(dataset, question_ids: Sequence) -> TensorDict:
    """One rollout batch holding the dataset rows of ``question_ids`` in order (repeats allowed), without uids: the
    trainer gives every batch the run's uids (``ToolkitTrainer._run_uids``)."""
    rows = question_rows(dataset)
    missing = [qid for qid in question_ids if qid not in rows]
    if missing:
        raise KeyError(f"planned question(s) {missing[:3]} are not in the training data ({len(rows)} questions)")
    return tu.get_tensordict(collate_fn([dataset[rows[qid]] for qid in question_ids]))
