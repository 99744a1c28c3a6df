"""The DIVA parquet format: written by ``diva-prep``, read by :class:`verl_ext.data.dataset.DivaDataset`.

One row per question. verl's own columns keep their meaning, so a DIVA parquet also loads in verl's
plain ``RLHFDataset`` (the GRPO baseline uses the same files):

=================  ====================================================================================
column             content
=================  ====================================================================================
``data_source``    dataset name, e.g. ``"mmk12"``
``prompt``         chat list ``[{"role": "user", "content": text}]``; ``text`` holds one ``<image>``
                   placeholder per image, then the question, then :data:`PROMPT_SUFFIX`
``images``         list of ``{"bytes": encoded image, "path": original path or ""}``
``ability``        e.g. ``"math"``
``reward_model``   ``{"style": "rule", "ground_truth": answer}``
``extra_info``     ``{"split", "index", "question_id", "answer", "question", "visual_entropy"}``;
                   ``question_id`` is the stable id the difficulty service keys on (never verl's per-step
                   ``uid``); ``visual_entropy`` is optional (null until ``diva-prep entropy`` fills it): the
                   eigenvalue entropy of the policy's vision features, mean over the row's images, that
                   Durian's perceptual buckets read. It lives in ``extra_info`` so that verl's own
                   ``RLHFDataset`` and ``DivaDataset`` both hand it to the trainer unchanged
``question``       the bare question text (no placeholders, no suffix): variants rebuild the prompt
``paraphrases``    list of question texts with the same answer (may be empty)
``hint_steps``     ordered reasoning steps that never state the final answer (may be empty)
``text_in_image``  whether rendering the question into a white band of the image is allowed
``difficulty``     optional initial difficulty in [1, 9] (null: the service's start value)
=================  ====================================================================================
"""

from __future__ import annotations

import pyarrow as pa

IMAGE_PLACEHOLDER = "<image>"

# The paper's prompt format: reasoning inside <think> </think>, final answer in \boxed{}.
PROMPT_SUFFIX = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. "
    "The final answer MUST BE put in \\boxed{}."
)

# Neutral instruction placed before appended hint steps: the model still reasons from the start.
HINT_HEADER = "Here are the first steps of a solution. Use them, but reason carefully from the start:"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
EXTRA_INFO_TYPE = pa.struct(
    [
        ("split", pa.string()),
        ("index", pa.int64()),
        ("question_id", pa.string()),
        ("answer", pa.string()),
        ("question", pa.string()),
        # Optional (nullable): written by `diva-prep entropy` (data_prep/entropy.py), read by Durian's advantage.
        ("visual_entropy", pa.float64()),
    ]
)
# extra_info fields a file may lack: files written before the field existed are still valid DIVA parquet.
OPTIONAL_EXTRA_INFO_FIELDS = ("visual_entropy",)

SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE_TYPE)),
        ("images", pa.list_(IMAGE_TYPE)),
        ("ability", pa.string()),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
        ("question", pa.string()),
        ("paraphrases", pa.list_(pa.string())),
        ("hint_steps", pa.list_(pa.string())),
        ("text_in_image", pa.bool_()),
        ("difficulty", pa.float64()),
    ]
)

REQUIRED_COLUMNS = tuple(SCHEMA.names)


def build_prompt_text(question: str, num_images: int, hint_steps: list[str] | None = None) -> str:
    """The user message: one placeholder per image, the question, optional hint steps, the suffix."""
    parts = [IMAGE_PLACEHOLDER * num_images + question.strip()]
    if hint_steps:
        steps = "\n".join(f"Step {i + 1}: {step.strip()}" for i, step in enumerate(hint_steps))
        parts.append(f"{HINT_HEADER}\n{steps}")
    parts.append(PROMPT_SUFFIX)
    return "\n".join(parts)


def build_prompt(question: str, num_images: int, hint_steps: list[str] | None = None) -> list[dict]:
    """verl's chat-list ``prompt`` for one user turn."""
    return [{"role": "user", "content": build_prompt_text(question, num_images, hint_steps)}]


def column_type_matches(name: str, actual: pa.DataType) -> bool:
    """Whether column ``name`` of a file has the format's type (``extra_info`` may lack its optional fields)."""
    expected = SCHEMA.field(name).type
    if actual.equals(expected):
        return True
    if name != "extra_info" or not pa.types.is_struct(actual):
        return False
    required = pa.struct([f for f in EXTRA_INFO_TYPE if f.name not in OPTIONAL_EXTRA_INFO_FIELDS])
    return actual.equals(required)


def missing_columns(names) -> list[str]:
    """Columns of :data:`SCHEMA` absent from ``names`` (a parquet file's column names)."""
    present = set(names)
    return [name for name in REQUIRED_COLUMNS if name not in present]
