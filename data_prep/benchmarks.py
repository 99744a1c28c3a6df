"""Layouts of the six evaluation sets of the paper's Table 1, as their public Hugging Face releases lay them out.

Each benchmark becomes a DIVA parquet of its own ``data_source`` (the layout name), so verl's validation reports one
accuracy per benchmark (``val-core/<data_source>/acc/mean@N``). Every prompt ends with the paper's suffix
(:data:`verl_ext.data.schema.PROMPT_SUFFIX`: reasoning in ``<think> </think>``, final answer in ``\\boxed{}``).

Answer forms, as :func:`verl_ext.reward.compute_score` grades them:

- **choice**: the ground truth is the option's capital letter (``A``..); the question lists the options as
  ``(A) ...`` lines followed by :data:`CHOICE_INSTRUCTION`; ``\\boxed{B}``, ``\\boxed{(B)}``, ``\\boxed{B. 30}`` all
  count as ``B``.
- **free form**: the ground truth is the release's answer text (numbers, expressions, lists), compared by exact text,
  then mathruler / math-verify.

========================  ============================================  =================================
layout (``data_source``)  release (split)                               columns read
========================  ============================================  =================================
``mathvista``             ``AI4Math/MathVista`` (``testmini``)          pid, question, decoded_image, choices,
                                                                        answer, question_type, answer_type,
                                                                        precision, unit
``mathverse``             ``AI4Math/MathVerse`` (``testmini``)          sample_index, problem_version, question,
                                                                        image, answer, question_type
``mathvision``            ``MathLLMs/MathVision`` (``test``)            id, question, options, decoded_image,
                                                                        answer, subject, level
``olympiadbench``         ``Hothan/OlympiadBench``                      id, question, final_answer, image_1..9,
                          (``OE_MM_maths_en_COMP``, split ``train``)    context, unit, is_multiple_answer
``wemath``                ``We-Math/We-Math`` (``testmini``)            ID, question, option, answer, image_path
``mmk12``                 ``FanqingM/MMK12`` (``test``)                 the training layout (data_prep/layouts.py)
========================  ============================================  =================================

Row problems (an answer that is not among the choices, no image) raise :class:`~data_prep.quarantine.BadRow` and the
row goes to the quarantine with its reason.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from data_prep.quarantine import BadRow

CHOICE_INSTRUCTION = "Answer with the letter of the correct option."
LETTERS = string.ascii_uppercase
# Inline image tags of the releases ("<image1>", "<image_2>"): the prompt gets its own placeholders (in the same
# order), so a tag becomes a reference in words, "(image 2)", and never a second placeholder.
_IMAGE_TAG = re.compile(r"<image_?(\d+)>")
# WeMath's one-string options: "A. 3; B. 4; C. 5" -> split before each "<letter>." after a semicolon.
_WEMATH_OPTION_SPLIT = re.compile(r";\s*(?=[A-Z][.:：])")
_LETTER_ANSWER = re.compile(r"\(?([A-Z])\)?\.?")


@dataclass
class Shaped:
    """One benchmark row as ``convert`` needs it: question text (options included), gold answer, image cells."""

    question: str
    answer: str
    images: list
    ability: str = "math"


@dataclass(frozen=True)
class BenchmarkLayout:
    """A benchmark's parquet layout: required columns (also its signature for ``--layout auto``), optional columns
    read when the file has them, and the function shaping one row."""

    name: str
    columns: tuple[str, ...]
    shape: Callable[[dict], Shaped]
    optional: tuple[str, ...] = field(default=())
    source: str = ""

    def read_columns(self, names) -> list[str]:
        return list(self.columns) + [c for c in self.optional if c in names]


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def strip_image_tags(text: str) -> str:
    """``<image1>`` / ``<image_1>`` -> ``(image 1)``; a tag that opens or closes the text is dropped."""
    text = text.strip()
    if (match := _IMAGE_TAG.match(text)) is not None and _IMAGE_TAG.fullmatch(text) is None:
        text = text[match.end() :]
    if (match := re.search(r"<image_?\d+>$", text)) is not None and match.start() > 0:
        text = text[: match.start()]
    return _IMAGE_TAG.sub(lambda m: f"(image {m.group(1)})", text)


def choice_block(options: list[str]) -> str:
    """``(A) first`` ... one line per option, then :data:`CHOICE_INSTRUCTION`."""
    if len(options) > len(LETTERS):
        raise BadRow(f"bad choices: {len(options)} options, more than the letters A-Z")
    lines = [f"({LETTERS[i]}) {_text(option)}" for i, option in enumerate(options)]
    return "Choices:\n" + "\n".join(lines) + "\n" + CHOICE_INSTRUCTION


def answer_letter(answer: str, options: list[str]) -> str:
    """The gold option's letter: the option whose text equals ``answer``, else ``answer`` itself when it is a letter."""
    texts = [_text(option) for option in options]
    if answer in texts:  # first: an option's own text may look like a letter (choices ["B", "A"])
        return LETTERS[texts.index(answer)]
    letter = _LETTER_ANSWER.fullmatch(answer)
    if letter is not None and LETTERS.index(letter.group(1)) < len(options):
        return letter.group(1)
    raise BadRow(f"bad answer: {answer!r} is neither an option letter nor one of the options {texts}")


def _options(value) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise BadRow(f"bad choices: expected a list of options, got {type(value).__name__}")
    return [_text(option) for option in value]


def _single_image(cell) -> list:
    return [] if cell is None else [cell]


# ----------------------------------------------------------------------------------------------- MathVista
def _mathvista_hint(cells: dict) -> str:
    """MathVista's answer-format hint for free-form questions (integer, float with a precision, list)."""
    kind = _text(cells.get("answer_type"))
    precision = cells.get("precision")
    if kind == "integer":
        return "Answer with an integer."
    if kind == "float" and precision is not None:
        places = int(precision)
        return f"Answer with a number with {places} decimal place{'s' if places != 1 else ''}."
    if kind == "float":
        return "Answer with a decimal number."
    if kind == "list":
        return "Answer with a Python list."
    return ""


def shape_mathvista(cells: dict) -> Shaped:
    question = _text(cells["question"])
    unit = _text(cells.get("unit"))
    if unit:
        question += f" (Unit: {unit})"
    answer = _text(cells["answer"])
    if _text(cells["question_type"]) == "multi_choice":
        options = _options(cells["choices"])
        if not options:
            raise BadRow("bad choices: a multi_choice question without choices")
        return Shaped(
            f"{question}\n{choice_block(options)}",
            answer_letter(answer, options),
            _single_image(cells["decoded_image"]),
        )
    hint = _mathvista_hint(cells)
    return Shaped(f"{question}\n{hint}" if hint else question, answer, _single_image(cells["decoded_image"]))


# ----------------------------------------------------------------------------------------------- MathVerse
def shape_mathverse(cells: dict) -> Shaped:
    # The question already lists the options ("Choices: A: ... B: ..."); the answer is the letter.
    question = _text(cells["question"])
    answer = _text(cells["answer"])
    if _text(cells["question_type"]) == "multi-choice":
        letter = _LETTER_ANSWER.fullmatch(answer)
        if letter is None:
            raise BadRow(f"bad answer: multi-choice answer {answer!r} is not an option letter")
        question, answer = f"{question}\n{CHOICE_INSTRUCTION}", letter.group(1)
    return Shaped(question, answer, _single_image(cells["image"]))


# ---------------------------------------------------------------------------------------------- MathVision
def shape_mathvision(cells: dict) -> Shaped:
    question = strip_image_tags(_text(cells["question"]))
    answer = _text(cells["answer"])
    options = _options(cells["options"])
    if options:
        question, answer = f"{question}\n{choice_block(options)}", answer_letter(answer, options)
    return Shaped(question, answer, _single_image(cells["decoded_image"]))


# ------------------------------------------------------------------------------------------- OlympiadBench
OLYMPIAD_IMAGE_COLUMNS = tuple(f"image_{i}" for i in range(1, 10))


def _strip_dollars(text: str) -> str:
    text = text.strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def shape_olympiadbench(cells: dict) -> Shaped:
    question = strip_image_tags(_text(cells["question"]))
    context = _text(cells.get("context"))
    if context:
        question = f"{strip_image_tags(context)}\n{question}"
    unit = _text(cells.get("unit"))
    if unit:
        question += f"\nThe unit of the answer is {unit}; give the number only."
    finals = cells["final_answer"]
    if isinstance(finals, str):
        finals = [finals]
    answers = [_strip_dollars(_text(a)) for a in (finals or []) if _text(a)]
    if cells.get("is_multiple_answer") and len(answers) > 1:
        question += "\nThe problem has several answers: give them all, separated by commas, in one \\boxed{}."
    images = [cells[c] for c in OLYMPIAD_IMAGE_COLUMNS if cells.get(c) is not None]
    return Shaped(question, ", ".join(answers), images)


# -------------------------------------------------------------------------------------------------- WeMath
def shape_wemath(cells: dict) -> Shaped:
    question = _text(cells["question"])
    option_text = _text(cells["option"])
    answer = _text(cells["answer"])
    if option_text:
        options = [part.strip() for part in _WEMATH_OPTION_SPLIT.split(option_text) if part.strip()]
        question = f"{question}\nChoices:\n" + "\n".join(options) + f"\n{CHOICE_INSTRUCTION}"
        letter = _LETTER_ANSWER.fullmatch(answer)
        if letter is None:
            raise BadRow(f"bad answer: {answer!r} is not an option letter")
        answer = letter.group(1)
    return Shaped(question, answer, _single_image(cells["image_path"]))


BENCHMARK_LAYOUTS = {
    layout.name: layout
    for layout in (
        BenchmarkLayout(
            "mathvista",
            ("pid", "question", "decoded_image", "choices", "answer", "question_type", "answer_type"),
            shape_mathvista,
            optional=("precision", "unit"),
            source="AI4Math/MathVista, split testmini",
        ),
        BenchmarkLayout(
            "mathverse",
            ("sample_index", "problem_version", "question", "image", "answer", "question_type"),
            shape_mathverse,
            source="AI4Math/MathVerse, testmini.parquet",
        ),
        BenchmarkLayout(
            "mathvision",
            ("id", "question", "options", "decoded_image", "answer", "subject", "level"),
            shape_mathvision,
            source="MathLLMs/MathVision, split test",
        ),
        BenchmarkLayout(
            "olympiadbench",
            ("id", "question", "final_answer", "image_1"),
            shape_olympiadbench,
            optional=("context", "unit", "is_multiple_answer", *OLYMPIAD_IMAGE_COLUMNS[1:]),
            source="Hothan/OlympiadBench, config OE_MM_maths_en_COMP",
        ),
        BenchmarkLayout(
            "wemath",
            ("ID", "question", "option", "answer", "image_path"),
            shape_wemath,
            source="We-Math/We-Math, testmini.parquet",
        ),
    )
}
