"""DIVA reward for verl's reward loop: ``acc_weight * acc + format_weight * format`` (paper: 0.9 / 0.1).

verl wiring (verl 0.9.1)::

    reward.custom_reward_function.path=pkg://verl_ext.reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.acc_weight=0.9      # optional, see compute_score
    +reward.custom_reward_function.reward_kwargs.format_weight=0.1

verl's ``get_custom_reward_fn`` loads :func:`compute_score` and merges ``reward_kwargs`` into its keyword
arguments; the ``naive`` reward manager calls it once per response, in a thread of the event loop's default
executor, as ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``. The returned dict's
``score`` becomes the response's reward; ``acc`` and ``format`` are kept as reward extra info.

Definitions, per response ``r`` with ground truth ``g``:

- answer(r): the content of the last ``\\boxed{...}`` in ``r``, brace-balanced (nested and ``\\{``/``\\}``
  escaped braces allowed). None when ``r`` has no ``\\boxed{``, when that last one is never closed, or when its
  content is longer than ``max_answer_chars`` (such answers count as wrong: no parser sees them).
- acc(r) = 1 if answer(r) is equivalent to ``g``, else 0. Equivalence, cheapest first:
  identical after removing whitespace and ``$``; for a multiple-choice ground truth (one capital letter,
  e.g. ``"B"`` or ``"(B)"``) the answer's choice letter (``B``, ``(B)``, ``B.``, ``\\text{B}``, ``(B) 30°``);
  otherwise mathruler's ``grade_answer`` (the checker of the authors' EasyR1 code) or math-verify
  (adds sets, intervals, equations), in a separate process that is killed after ``verify_timeout_s``.
- format(r) = 1 if ``r`` fully matches :data:`FORMAT_PATTERN` (optional whitespace, ``<think>``, the
  thought, ``</think>``, then the rest), ``<think>`` and ``</think>`` each occur exactly once, and the rest
  (after ``</think>``) contains a complete ``\\boxed{...}`` answer; else 0.

Why a separate process: sympy can spend unbounded time on short strings (``\\boxed{10^{10^{10}}}`` never
returns), and math-verify's own timeout uses ``signal.alarm``, which only works in the main thread; verl
calls reward functions from executor threads. A persistent child process (one per reward worker process,
started on first use) runs the comparison in its own main thread; the caller waits at most
``verify_timeout_s`` and kills the child on expiry (acc = 0, child restarted on the next call).
Model output is never evaluated as Python.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

DEFAULT_ACC_WEIGHT = 0.9
DEFAULT_FORMAT_WEIGHT = 0.1
# Longer boxed contents are wrong without parsing: real final answers are short, parsers are super-linear.
DEFAULT_MAX_ANSWER_CHARS = 1000
# Wall-clock bound of one equivalence check in the verifier process (a cold sympy parse takes ~0.3 s).
DEFAULT_VERIFY_TIMEOUT_S = 5.0
# Bound on starting the verifier process (imports sympy, math-verify, mathruler).
VERIFIER_START_TIMEOUT_S = 120.0

# Keyword arguments verl's reward managers may add on their own (reward-model router); accepted and unused.
_VERL_PASSED_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})

# Whole response: optional whitespace, one think block, then the rest (checked for a boxed answer).
# Linear time: the tag counts are checked first, so the lazy ``.*?`` has one ``</think>`` to find.
FORMAT_PATTERN = re.compile(r"\A\s*<think>(?P<thought>.*?)</think>(?P<rest>.*)\Z", re.DOTALL)

_BOXED = "\\boxed"
# A multiple-choice ground truth: one capital letter, optionally in parentheses, optionally a trailing dot.
_CHOICE_GROUND_TRUTH = re.compile(r"\(?([A-Z])\)?\.?")
# A choice-shaped answer: the letter, optionally in parentheses, optionally followed by ".", ":" or the option text.
_CHOICE_ANSWER = re.compile(r"\(?([A-Z])\)?(?:[.:]|[.:]?\s.*)?", re.DOTALL)
# Latex text wrappers around a choice letter: \text{B}, \textbf{(B)}, \mathrm{B}.
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}", re.DOTALL)


def extract_last_boxed(text: str, max_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, stripped; None if absent, unclosed or too long.

    The brace scan counts ``{`` / ``}`` depth, skipping backslash-escaped characters (``\\{`` is a literal
    brace in latex), and reads at most ``max_chars + 1`` characters, so the cost is O(len(text)) for the
    reverse search plus O(max_chars) for the scan, whatever the nesting. A ``\\boxed`` not followed by
    ``{`` (e.g. ``\\boxed 5``, ``\\boxedsymbol``) is not an answer and the search moves to the previous one.
    """
    end = len(text)
    while True:
        start = text.rfind(_BOXED, 0, end)
        if start < 0:
            return None
        pos = start + len(_BOXED)
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos < len(text) and text[pos] == "{":
            break
        end = start
    content_start = pos + 1
    scan_end = min(len(text), content_start + max_chars + 1)
    depth = 1
    pos = content_start
    while pos < scan_end:
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[content_start:pos].strip()
        pos += 1
    return None


def format_reward(response: str, max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> float:
    """1.0 if ``response`` is ``<think>...</think>`` then text holding a ``\\boxed{...}`` answer, else 0.0.

    Exactly one ``<think>`` and one ``</think>``; whitespace before ``<think>`` is allowed; the thought may be
    empty; the boxed answer must come after ``</think>`` and be complete (see :func:`extract_last_boxed`).
    """
    if response.count("<think>") != 1 or response.count("</think>") != 1:
        return 0.0
    match = FORMAT_PATTERN.match(response)
    if match is None:
        return 0.0
    return 1.0 if extract_last_boxed(match.group("rest"), max_answer_chars) is not None else 0.0


def _compact(answer: str) -> str:
    """Answer without whitespace and ``$`` delimiters, for the cheap exact-match test."""
    return re.sub(r"[\s$]", "", answer)


def _choice_letter(answer: str) -> str | None:
    """The choice letter of a choice-shaped answer (``B``, ``(B)``, ``B.``, ``\\text{(B)}``, ``B: 30``)."""
    answer = answer.strip().strip("$").strip()
    wrapped = _TEXT_WRAPPER.fullmatch(answer)
    if wrapped is not None:
        answer = wrapped.group(1).strip()
    match = _CHOICE_ANSWER.fullmatch(answer)
    return match.group(1) if match is not None else None


class BoundedVerifier:
    """Answer equivalence (mathruler, then math-verify) in a child process, at most ``timeout_s`` per check.

    One child per owning process, started lazily and restarted after a kill or crash; calls from several
    threads are serialised by a lock (the comparison is GIL-bound, so a thread pool gains nothing from
    running them side by side in one process). Protocol: one JSON object per line over the child's
    stdin/stdout; the child announces ``{"ready": true}`` once its imports are done.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._owner_pid = os.getpid()
        self.starts = 0  # processes started so far (more than 1 means a timeout kill or a crash)

    def equivalent(self, ground_truth: str, answer: str, timeout_s: float) -> bool:
        """True if ``answer`` equals ``ground_truth`` mathematically; False when unequal or past ``timeout_s``."""
        with self._lock:
            self._start_if_needed()
            request = json.dumps({"gold": ground_truth, "pred": answer, "timeout_s": timeout_s}) + "\n"
            try:
                self._proc.stdin.write(request.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._stop()
                raise RuntimeError("verl_ext.reward verifier process died; see its stderr above") from None
            line = self._read_line(timeout_s)
            if line is None:
                logger.warning(
                    "answer check exceeded %.1f s; scored as wrong (answer starts %r)", timeout_s, answer[:80]
                )
                self._stop()
                return False
            return bool(json.loads(line)["equal"])

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start_if_needed(self) -> None:
        if self._owner_pid != os.getpid():  # forked copy: the pipes belong to the parent's child
            self._proc, self._buffer, self._owner_pid = None, b"", os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return
        # Load this very file by path in the child, so it works whether verl loaded us as pkg:// or a file.
        bootstrap = (
            "import importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('verl_ext_reward_verifier', sys.argv[1]); "
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
            "module._serve_verifier()"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", bootstrap, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._buffer = b""
        self.starts += 1
        ready = self._read_line(VERIFIER_START_TIMEOUT_S)
        if ready is None or not json.loads(ready).get("ready"):
            self._stop()
            raise RuntimeError(
                "verl_ext.reward could not start its answer-verifier process within "
                f"{VERIFIER_START_TIMEOUT_S:.0f} s; check that math-verify and mathruler are installed "
                f"in {sys.executable} (pip install math-verify mathruler) and see the stderr above"
            )

    def _read_line(self, timeout_s: float) -> bytes | None:
        """One line from the child, or None if it did not come within ``timeout_s`` or the child exited."""
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # EOF: the child exited
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            self._proc = None
            self._buffer = b""


def _serve_verifier() -> None:
    """Child process loop: read ``{"gold", "pred", "timeout_s"}`` lines, write ``{"equal": bool}`` lines.

    Runs in the child's main thread, so math-verify's signal-based timeouts work here too; they catch most
    slow parses without a kill. The parent's wall-clock bound still covers computations that signals cannot
    interrupt (one long C-level big-integer operation).
    """
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    # Library output must not corrupt the protocol stream: Python prints and C-level writes to fd 1 go to stderr.
    sys.stdout = sys.stderr
    os.dup2(sys.stderr.fileno(), 1)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its per-timeout warnings are expected here

    from math_verify import parse, verify
    from mathruler.grader import grade_answer

    def equal(gold: str, pred: str, timeout_s: float) -> bool:
        seconds = max(1, int(timeout_s))
        try:
            if grade_answer(pred, gold):
                return True
        except Exception:  # mathruler raises on some malformed latex: not equal by that checker
            pass
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=seconds)
        pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=seconds)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=seconds))

    protocol_out.write(json.dumps({"ready": True}) + "\n")
    protocol_out.flush()
    for line in sys.stdin:  # ends when the parent closes the pipe or dies
        request = json.loads(line)
        try:
            result = equal(request["gold"], request["pred"], request["timeout_s"])
        except Exception:
            logging.getLogger(__name__).debug("answer check failed", exc_info=True)
            result = False
        protocol_out.write(json.dumps({"equal": result}) + "\n")
        protocol_out.flush()


_VERIFIER = BoundedVerifier()
atexit.register(_VERIFIER.close)


def accuracy_reward(
    answer: str | None,
    ground_truth: str,
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
    verifier: BoundedVerifier | None = None,
) -> float:
    """1.0 if the extracted ``answer`` is equivalent to ``ground_truth`` (see the module docstring), else 0.0."""
    if answer is None or not answer:
        return 0.0
    if _compact(answer) == _compact(ground_truth):
        return 1.0
    choice = _CHOICE_GROUND_TRUTH.fullmatch(ground_truth.strip())
    if choice is not None:
        return 1.0 if _choice_letter(answer) == choice.group(1) else 0.0
    return 1.0 if (verifier or _VERIFIER).equivalent(ground_truth, answer, verify_timeout_s) else 0.0


def _checked_weight(name: str, value) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = math.nan
    if not math.isfinite(weight):
        raise ValueError(f"reward.custom_reward_function.reward_kwargs.{name} must be a finite number, got {value!r}")
    return weight


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    acc_weight: float = DEFAULT_ACC_WEIGHT,
    format_weight: float = DEFAULT_FORMAT_WEIGHT,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
    **verl_kwargs,
) -> dict[str, float]:
    """DIVA reward of one response: ``{"score": acc_weight * acc + format_weight * format, "acc", "format"}``.

    Args:
        data_source: dataset name (unused by the rule; part of verl's call).
        solution_str: the decoded response.
        ground_truth: the reference answer (``reward_model.ground_truth`` of the parquet row); numbers are
            accepted and compared as their ``str``.
        extra_info: the row's ``extra_info`` (unused; named in error messages).
        acc_weight, format_weight, max_answer_chars, verify_timeout_s: knobs, set through
            ``reward.custom_reward_function.reward_kwargs``.
        **verl_kwargs: ``reward_router_address`` / ``reward_model_tokenizer``, which verl adds when a reward
            model router exists; ignored. Any other key is a typo in ``reward_kwargs`` and raises.

    Returns:
        dict of floats; ``acc`` and ``format`` are 0.0 or 1.0.
    """
    unknown = set(verl_kwargs) - _VERL_PASSED_KWARGS
    if unknown:
        raise TypeError(
            f"verl_ext.reward.compute_score got unknown reward_kwargs {sorted(unknown)}; valid keys are "
            "acc_weight, format_weight, max_answer_chars, verify_timeout_s "
            "(set under reward.custom_reward_function.reward_kwargs)"
        )
    acc_weight = _checked_weight("acc_weight", acc_weight)
    format_weight = _checked_weight("format_weight", format_weight)
    verify_timeout_s = _checked_weight("verify_timeout_s", verify_timeout_s)
    if verify_timeout_s <= 0 or int(max_answer_chars) <= 0:
        raise ValueError(
            "reward.custom_reward_function.reward_kwargs.verify_timeout_s and max_answer_chars must be positive, "
            f"got {verify_timeout_s!r} and {max_answer_chars!r}"
        )
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be a str, got {type(solution_str).__name__}")
    if ground_truth is None or isinstance(ground_truth, (bytes, dict, list, tuple)):
        question = (extra_info or {}).get("question_id", "?")
        raise ValueError(
            f"ground truth must be a string or number, got {ground_truth!r} (data_source={data_source!r}, "
            f"question_id={question!r}); fix reward_model.ground_truth in the parquet"
        )
    max_answer_chars = int(max_answer_chars)
    answer = extract_last_boxed(solution_str, max_answer_chars)
    acc = accuracy_reward(answer, str(ground_truth), verify_timeout_s)
    fmt = format_reward(solution_str, max_answer_chars)
    return {"score": acc_weight * acc + format_weight * fmt, "acc": acc, "format": fmt}
