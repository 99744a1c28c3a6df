"""What ``variants`` asks the model, and which replies it accepts.

Both tasks ask for one JSON object (parsed with ``json.loads``; nothing is ever evaluated):

* paraphrases: ``{"paraphrases": [str, ...]}``. A paraphrase is accepted when it is non-empty, differs from the
  question and from the other paraphrases, keeps exactly the question's set of numbers (a cheap guard that the
  answer is unchanged) and does not reveal the answer.
* hint: ``{"steps": [str, ...], "final_answer": str}``. Accepted only when the model's own final answer matches the
  ground truth (math-verify), there are 3 to 5 steps, and no step leaks the answer (:func:`answers.hint_leak`).

Every refusal is returned as ``{"reason": ..., "output": ...}`` for the rejects file.
"""

from __future__ import annotations

import base64
import io
import json
import re

from PIL import Image

from data_prep.answers import answers_match, hint_leak
from verl_ext.data.schema import IMAGE_PLACEHOLDER

# Bump one when its prompt changes: cached results of the older prompt are then not reused (each task has its own
# version, so changing one prompt does not re-request the other task).
PARAPHRASE_PROMPT_VERSION = 1
HINT_PROMPT_VERSION = 1
MIN_HINT_STEPS, MAX_HINT_STEPS = 3, 5

PARAPHRASE_SYSTEM = (
    "You rewrite math questions. Reply with one JSON object and nothing else, of the form "
    '{"paraphrases": ["...", "..."]}.'
)
PARAPHRASE_USER = (
    "Write {k} paraphrases of the question below. Each must ask exactly the same thing, so that its answer is "
    "unchanged: keep every number, quantity, unit, label and condition, refer to the figure the same way, add no "
    "information and do not solve it. Vary wording and sentence structure.\n\nQuestion: {question}"
)
HINT_SYSTEM = (
    "You solve math problems and write the first steps of the solution as a hint. Reply with one JSON object and "
    'nothing else, of the form {"steps": ["...", "...", "..."], "final_answer": "..."}.'
)
HINT_USER = (
    'Solve the problem. In "steps" give {lo} to {hi} short reasoning steps that lead towards the answer; the steps '
    "must NEVER state the final answer or the final result of the computation. Put only the final answer (a number, "
    'expression or option letter, no words) in "final_answer".\n\nProblem: {question}'
)

_NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?")
_CODE_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


class MalformedReply(ValueError):
    pass


def _image_url(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as image:
        mime = Image.MIME.get(image.format or "", "image/png")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def paraphrase_messages(question: str, k: int) -> list[dict]:
    return [
        {"role": "system", "content": PARAPHRASE_SYSTEM},
        {"role": "user", "content": PARAPHRASE_USER.format(k=k, question=question)},
    ]


def hint_messages(question: str, images: list[bytes], text_only: bool = False) -> list[dict]:
    text = HINT_USER.format(lo=MIN_HINT_STEPS, hi=MAX_HINT_STEPS, question=question)
    if text_only or not images:
        content: str | list = text
    else:  # OpenAI vision format: the images first, then the text
        content = [{"type": "image_url", "image_url": {"url": _image_url(data)}} for data in images]
        content.append({"type": "text", "text": text})
    return [{"role": "system", "content": HINT_SYSTEM}, {"role": "user", "content": content}]


def parse_json_reply(text: str) -> dict:
    """The reply's JSON object; tolerates a ```json fence or prose around a single ``{...}``."""
    stripped = _CODE_FENCE.sub("", text.strip())
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        start, end = stripped.find("{"), stripped.rfind("}")
        if start < 0 or end <= start:
            raise MalformedReply("malformed output: no JSON object in the reply") from None
        try:
            value = json.loads(stripped[start : end + 1])
        except json.JSONDecodeError as exc:
            raise MalformedReply(f"malformed output: invalid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise MalformedReply(f"malformed output: expected a JSON object, got {type(value).__name__}")
    return value


def _numbers(text: str) -> list[str]:
    return sorted({str(float(n)) for n in _NUMBER.findall(text.replace(",", ""))})


def _squash(text: str) -> str:
    return " ".join(text.lower().split())


def accept_paraphrases(
    text: str, question: str, answer: str, wanted: int, existing: list[str] = ()
) -> tuple[list[str], list[dict]]:
    """(accepted paraphrases, at most ``wanted`` and none repeating ``existing``; rejects) from one reply."""
    try:
        value = parse_json_reply(text).get("paraphrases")
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise MalformedReply('malformed output: "paraphrases" must be a list of strings')
    except MalformedReply as exc:
        return [], [{"reason": str(exc), "output": text}]
    accepted, rejects = [], []
    seen = {_squash(question), *(_squash(item) for item in existing)}
    question_numbers = _numbers(question)
    for item in value:
        candidate = " ".join(item.replace(IMAGE_PLACEHOLDER, " ").split())
        reason = None
        if not candidate:
            reason = "empty paraphrase"
        elif _squash(candidate) in seen:
            reason = "paraphrase repeats the question or another paraphrase"
        elif _numbers(candidate) != question_numbers:
            reason = f"paraphrase changes the numbers: {_numbers(candidate)} instead of {question_numbers}"
        elif leak := hint_leak(candidate, answer, question):
            reason = leak.replace("hint", "paraphrase", 1).replace("step", "paraphrase")
        elif len(accepted) >= wanted:
            reason = f"more paraphrases than the {wanted} asked for"
        if reason:
            rejects.append({"reason": reason, "output": item})
        else:
            accepted.append(candidate)
            seen.add(_squash(candidate))
    return accepted, rejects


def accept_hint(text: str, question: str, answer: str) -> tuple[list[str] | None, list[dict]]:
    """(hint steps or None; rejects) from one reply."""
    try:
        value = parse_json_reply(text)
        steps, final = value.get("steps"), value.get("final_answer")
        if not isinstance(steps, list) or not all(isinstance(step, str) for step in steps):
            raise MalformedReply('malformed output: "steps" must be a list of strings')
        if not isinstance(final, (str, int, float)) or isinstance(final, bool):
            raise MalformedReply('malformed output: "final_answer" must be a string or number')
    except MalformedReply as exc:
        return None, [{"reason": str(exc), "output": text}]
    steps = [" ".join(step.split()) for step in steps if step.strip()]
    if not answers_match(str(final), answer):
        return None, [{"reason": f"wrong final answer: {str(final)!r}, expected {answer!r}", "output": text}]
    if not MIN_HINT_STEPS <= len(steps) <= MAX_HINT_STEPS:
        reason = f"wrong number of steps: {len(steps)}, need {MIN_HINT_STEPS} to {MAX_HINT_STEPS}"
        return None, [{"reason": reason, "output": text}]
    for number, step in enumerate(steps):
        leak = hint_leak(step, answer, question)
        if leak:
            return None, [{"reason": f"{leak} (step {number + 1})", "output": text}]
    return steps, []
