"""Answer equivalence (math-verify) and the "does this hint give the answer away" check.

Used by ``variants`` (accept a hint only when the model's own final answer matches the ground truth and no step
states it) and by ``validate`` (hints in a finished file must not leak).
"""

from __future__ import annotations

import re

from math_verify import parse, verify

_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_PHRASE = re.compile(r"\b(final answer|the answer is|answer\s*[:=])", re.IGNORECASE)
_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\$|\s+")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_EQUATION_RHS = re.compile(r"=\s*([^=,;:]+?)\s*(?:[,;:]|\.(?:\s|$)|$)")


def normalize_answer(text: str) -> str:
    """Strip ``$``, ``\\boxed{}``, spacing commands, whitespace, a trailing period and thousands commas; lowercase."""
    text = str(text).strip()
    match = re.fullmatch(r"\\boxed\s*\{(.*)\}", text)
    if match:
        text = match.group(1)
    text = _LATEX_NOISE.sub("", text).rstrip(".").lower()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


def answers_match(predicted: str, ground_truth: str) -> bool:
    """Whether ``predicted`` is mathematically the same answer as ``ground_truth``.

    Fast path: equal after :func:`normalize_answer`. Otherwise math-verify parses both (as LaTeX in ``$...$``, which
    also accepts plain expressions) and compares symbolically; an empty or unparsable side never matches.
    """
    if predicted is None or ground_truth is None:
        return False
    left, right = normalize_answer(predicted), normalize_answer(ground_truth)
    if not left or not right:
        return False
    if left == right:
        return True
    gold = parse(f"${ground_truth}$") or parse(str(ground_truth))
    pred = parse(f"${predicted}$") or parse(str(predicted))
    if not gold or not pred:
        return False
    return bool(verify(gold, pred))


def _contains_answer_token(text: str, answer: str) -> bool:
    normalized_text = _LATEX_NOISE.sub("", text).lower()
    if _NUMBER.match(answer):
        # A number only counts as itself, not as part of a longer number ("12" is not in "112" or "1.25").
        digits_text = re.sub(r"(?<=\d),(?=\d{3})", "", normalized_text)
        return re.search(rf"(?<![\d.]){re.escape(answer)}(?![\d]|\.\d)", digits_text) is not None
    if len(answer) == 1 and answer.isalpha():
        # A choice letter ("b") appears in ordinary words: only "option b", "choice (b)", "answer b" count.
        spaced = text.lower()
        pattern = rf"\b(option|choice|answer(\s+is)?)\s*\(?{answer}\)?(?![a-z])"
        return re.search(pattern, spaced) is not None
    return answer in normalized_text


def hint_leak(step: str, answer: str, question: str = "") -> str | None:
    """Why ``step`` gives away ``answer``, or None when it does not.

    A step leaks when it contains ``\\boxed{}`` or an "answer is" phrase, contains the normalised answer (numbers as
    whole numbers, choice letters only after "option/choice/answer"; skipped when the question itself contains the
    answer, since a step may repeat a given), or states an equation whose right-hand side equals the answer.
    """
    answer_norm = normalize_answer(answer)
    if not answer_norm:
        return None
    if _BOXED.search(step):
        return "hint leaks the answer: step contains \\boxed{}"
    if _ANSWER_PHRASE.search(step):
        return "hint leaks the answer: step announces the answer"
    if _contains_answer_token(step, answer_norm) and not (question and _contains_answer_token(question, answer_norm)):
        return f"hint leaks the answer: step contains {answer!r}"
    for rhs in _EQUATION_RHS.findall(step):
        if answers_match(rhs, answer):
            return f"hint leaks the answer: step states = {rhs.strip()!r}"
    return None
