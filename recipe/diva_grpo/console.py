"""The console a user reads: the run's own lines, one line per training step, errors; everything else in a full log.

Two places produce console output, and each keeps third-party chatter out of it without losing any of it:

- **In a process** (the preflight, which runs inside its job, and the submitter, whose Ray client logs its packaging
  notes): :func:`quiet_console` writes every log record (and every Python warning, through
  ``logging.captureWarnings``) to a full log file and drops, from the console handlers only, records below ERROR of
  the loggers in :data:`QUIET_LOGGERS`; it also turns off the ``datasets`` progress bars. :func:`stdout_to` sends
  ``print`` output to the same file while verl trains. TransferQueue alone warns on every batch operation that its
  thread count exceeds the machine's physical cores: hundreds of identical lines.
- **A job's log stream** (what ``recipe/diva_grpo/submit.py`` follows: the driver's and every actor's output, as Ray
  forwards it): :class:`JobConsole` writes every line to the full log and shows the lines of :func:`console_line`:
  the project's own (``[diva]``, ``[cpu]``, ``[cluster]``, ... :data:`PROJECT_TAGS`), each of verl's per-step
  metric lines as one readable line with a progress bar (:func:`step_summary`), and anything that looks like an
  error (tracebacks whole, exception and ERROR lines, Ray's raylet and autoscaler messages). verl's config dump,
  its validation-metric dicts, TransferQueue's warnings, model-loading bars and the like stay in the full log.

Errors are never filtered: an error line always reaches the console, and a job that fails ends with the last lines
of its stream (the submitter prints :meth:`JobConsole.tail`), then the one error that failed it
(:meth:`JobConsole.failure`: Ray renders a task's error with its cause's traceback after it, so the stream's last
exception is often the cause, and the error that explains the failure, such as ``NodeLostError``, scrolls out of the
tail). ``verbose=True`` (the launchers' ``VERBOSE=1``) shows the whole stream, as it comes.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from collections import deque
from contextlib import contextmanager, redirect_stdout

from verl_ext.cluster.placement import PLACEMENT_PREFIX

# Logger names (and their children) whose warnings and infos say nothing to a preflight user.
QUIET_LOGGERS = ("transfer_queue", "py.warnings", "ray", "torchdata")
FULL_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MARK = "_diva_full_log"


class ThirdPartyFilter(logging.Filter):
    """Lets a record through unless it comes from :data:`QUIET_LOGGERS` below ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return not any(record.name == name or record.name.startswith(name + ".") for name in QUIET_LOGGERS)


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]


def _console_handlers() -> list[logging.Handler]:
    handlers = []
    for logger in _loggers():
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream in (sys.stdout, sys.stderr, sys.__stderr__):
                handlers.append(handler)
    return handlers


def _full_log_owners() -> list[logging.Logger]:
    """The root logger and every logger whose records do not reach it (Ray's ``ray`` logger keeps its own
    handler and does not propagate): each gets the full log's handler."""
    own = [logger for logger in _loggers()[1:] if not logger.propagate]
    return [logging.getLogger()] + [
        logger for logger in own if any(not getattr(h, _MARK, False) for h in logger.handlers)
    ]


def quiet_console(full_log: str) -> logging.Handler:
    """Apply the filtering to every console handler that exists now; returns the full log's file handler.

    Call it after the noisy libraries are imported (their loggers and handlers exist from import on); calling it
    again later covers loggers created since.
    """
    logging.captureWarnings(True)
    root = logging.getLogger()
    full_log = os.path.abspath(full_log)
    handler = None
    for owner in _full_log_owners():
        for old in [h for h in owner.handlers if getattr(h, _MARK, False)]:
            if old.baseFilename == full_log:
                handler = old
            else:  # an earlier preflight's log in the same process (tests): one full log at a time
                owner.removeHandler(old)
                old.close()
    if handler is None:
        handler = logging.FileHandler(full_log, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FULL_LOG_FORMAT))
        setattr(handler, _MARK, True)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    for owner in _full_log_owners():
        if handler not in owner.handlers:
            owner.addHandler(handler)
    for console in _console_handlers():
        if not any(isinstance(f, ThirdPartyFilter) for f in console.filters):
            console.addFilter(ThirdPartyFilter())
    try:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except ImportError:
        pass
    return handler


def end_quiet_console(handler: logging.Handler) -> None:
    """Close the full log of :func:`quiet_console` and give Python's warnings back to their own display (the filters
    on the console handlers stay)."""
    for logger in _loggers():
        if handler in logger.handlers:
            logger.removeHandler(handler)
    handler.close()
    logging.captureWarnings(False)


@contextmanager
def stdout_to(full_log: str):
    """Send ``print`` output to ``full_log`` inside the block (verl prints whole validation-metric dicts, hundreds
    of lines, at the start and end of ``fit``); log records and progress bars still reach the console."""
    with open(full_log, "a", encoding="utf-8") as handle, redirect_stdout(handle):
        yield


# ---- a job's log stream ---------------------------------------------------------------------------------------

# The prefixes of the project's own console lines (``[tag] ...``). tests/recipe/test_console_on_cpu.py fails when
# the code prints a tag missing here: such a line would vanish from the console.
PROJECT_TAGS = (
    "diva",
    "cpu",
    "cluster",
    "preflight",
    "fault",
    "rollout",
    "nc_grpo",
    "compare",
    "cluster_cpu",
    "setup_vllm_cpu",
    "bench",
    "sweep",
    "sparse",
)
# Each method's metric that the step line shows (under the method's metric prefix), first one logged; then the
# fallbacks. Every method logs a collapse rate: the share of groups whose advantages vanish, which all of these GRPO
# variants address. NC-GRPO shows how many noisy rollouts branched (its noise does nothing otherwise), PGPO the
# share of tokens its gate amplifies.
KEY_METRICS = {
    "diva": ("collapse_rate/local",),
    "grpo": ("collapse_rate",),
    "avspo": ("collapse_rate/after",),
    "codapo": ("collapse_rate",),
    "durian": ("collapse_rate/prompts",),
    "mupo": ("collapse_rate/partition",),
    "noise_contrastive_grpo": ("branch/rate", "collapse_rate"),
    "pgpo": ("share_above_tau",),
}
FALLBACK_KEY_METRICS = ("collapse_rate", "advantage/zero_fraction")
SCORE_KEY = "critic/score/mean"
STEP_TIME_KEY = "timing_s/step"
BAR_WIDTH = 20
TAIL_LINES = 40

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's prefix on a line an actor or task printed, "(DivaTaskRunner pid=123, ip=10.0.0.2) ", and on its own
# processes' messages, "(raylet) ", "(autoscaler +1m2s) ".
_RAY_PREFIX = re.compile(r"^\((?P<source>[^()]*\bpid=\d+[^()]*|raylet[^()]*|autoscaler[^()]*|gcs_server[^()]*)\) ?")
_RAY_OWN = ("raylet", "autoscaler", "gcs_server")
# At the start of the line, or after a log record's own prefix ("WARNING:<time>:[diva] ...").
_TAG = re.compile(r"(?:^|[:-] ?)\[(?:" + "|".join(PROJECT_TAGS) + r")\] ")
_ERROR = re.compile(r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception)\b|\b(?:ERROR|CRITICAL|FATAL)\b")
# Ray's rendering of a task's exception, which names the error the task raised
# ("ray.exceptions.RayTaskError(NodeLostError): ray::TaskRunner.run() ..."); its frames follow, indented.
_RAY_TASK_ERROR = re.compile(r"^[\w.]*(?:Error|Exception)\((?P<name>\w+)\): ")
# A line that opens a traceback-like block: Python's header, or Ray's rendering.
_BLOCK_START = re.compile(r"Traceback \(most recent call last\)|" + _RAY_TASK_ERROR.pattern)
# A traceback's exception line: "verl_ext.cluster.node_watch.NodeLostError: lost node node-1 ...".
_RAISED = re.compile(r"^(?:\w+\.)*(?P<name>\w+(?:Error|Exception|Exit|Interrupt))(?::|$)")
_BLOCK_GO_ON = ("During handling of the above exception", "The above exception was the direct cause")
_STEP = re.compile(r"^step:(\d+) - (.*)$")
_PROGRESS = re.compile(r"Training Progress:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")
_VAL_CORE = re.compile(r"^val-core/(?P<source>[^/]+)/(?P<name>[^/]+)/mean@(?P<n>\d+)$")


def strip_ansi(line: str) -> str:
    return _ANSI.sub("", line)


def split_ray_prefix(line: str) -> tuple[str | None, str]:
    """``(source, text)``: the process Ray names at the start of ``line`` (``None``: the driver), and the rest."""
    match = _RAY_PREFIX.match(line)
    if not match:
        return None, line
    return match.group("source"), line[match.end() :]


def parse_step_line(text: str) -> tuple[int, dict[str, float]] | None:
    """verl's console logger line ``step:N - key:value - ...`` as ``(N, {key: value})`` (numbers only; numpy
    scalars as verl prints them, ``np.float64(0.5)``, included); ``None`` for any other line."""
    match = _STEP.match(text)
    if not match:
        return None
    metrics = {}
    for item in match.group(2).split(" - "):
        key, sep, value = item.rpartition(":")
        if not sep:
            continue
        value = value.strip()
        scalar = _NUMPY_SCALAR.match(value)
        try:
            metrics[key] = float(scalar.group(1) if scalar else value)
        except ValueError:
            continue
    return int(match.group(1)), metrics


def method_prefix(metrics: dict[str, float]) -> str | None:
    """The toolkit method's metric prefix in a step's metrics: every method logs ``<prefix>/advantage/mean``."""
    prefixes = sorted({key.split("/advantage/")[0] for key in metrics if "/advantage/" in key})
    prefixes = [p for p in prefixes if "/" not in p]
    known = [p for p in prefixes if p in KEY_METRICS]
    return (known or prefixes or [None])[0]


def key_metric(metrics: dict[str, float]) -> tuple[str, float] | None:
    """The method's key metric of :data:`KEY_METRICS` (or a fallback) and its value, when the step logged one."""
    prefix = method_prefix(metrics)
    if prefix is None:
        return None
    for name in KEY_METRICS.get(prefix, ()) + FALLBACK_KEY_METRICS:
        key = f"{prefix}/{name}"
        if key in metrics:
            return key, metrics[key]
    return None


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def validation_summary(metrics: dict[str, float]) -> str | None:
    """``acc 0.344`` (one data source) or ``acc geo3k 0.344, mathvista 0.281``: verl's ``val-core`` means, the
    most samples' for each source."""
    best: dict[tuple[str, str], tuple[int, float]] = {}
    for key, value in metrics.items():
        match = _VAL_CORE.match(key)
        if match:
            slot = (match.group("name"), match.group("source"))
            n = int(match.group("n"))
            if slot not in best or n > best[slot][0]:
                best[slot] = (n, value)
    if not best:
        return None
    names = sorted({name for name, _ in best})
    parts = []
    for name in names:
        sources = sorted(source for n, source in best if n == name)
        if len(sources) == 1:
            parts.append(f"{name} {_number(best[(name, sources[0])][1])} ({sources[0]})")
        else:
            parts.append(f"{name} " + ", ".join(f"{s} {_number(best[(name, s)][1])}" for s in sources))
    return "; ".join(parts)


def progress_bar(done: int, total: int) -> str:
    filled = min(BAR_WIDTH, max(0, round(BAR_WIDTH * done / total))) if total > 0 else 0
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def step_summary(step: int, metrics: dict[str, float], total: int | None = None) -> str:
    """One readable line for verl's metric line of ``step``: progress, score, accuracy, the method's key metric,
    the step's time and any validation; a line of validation metrics only (before training, or when a resumed
    trainer starts) reads ``validation ...``."""
    validation = validation_summary(metrics)
    trained = STEP_TIME_KEY in metrics or SCORE_KEY in metrics or "training/global_step" in metrics
    if not trained:
        when = "before training" if step == 0 else f"at step {step}"
        return f"validation {when}: {validation or 'no val-core metric'}"
    head = f"step {step}/{total} {progress_bar(step, total)}" if total else f"step {step}"
    parts = []
    if SCORE_KEY in metrics:
        parts.append(f"score {_number(metrics[SCORE_KEY])}")
    prefix = method_prefix(metrics)
    if prefix and f"{prefix}/accuracy/mean" in metrics:
        parts.append(f"acc {_number(metrics[f'{prefix}/accuracy/mean'])}")
    found = key_metric(metrics)
    if found:
        parts.append(f"{found[0]} {_number(found[1])}")
    if STEP_TIME_KEY in metrics:
        parts.append(f"{metrics[STEP_TIME_KEY]:.1f} s")
    if validation:
        parts.append(f"val {validation}")
    return f"{head}  {' | '.join(parts)}" if parts else head


class JobConsole:
    """Follows a job's log stream: every line into ``log_path`` (appended, colour codes removed), the lines a user
    reads to ``out``, the last :data:`TAIL_LINES` kept for :meth:`tail`.

    Feed it what Ray's log tail yields (:meth:`write`: any chunk, lines may be split across chunks), then call
    :meth:`close`. On a terminal, a status line (elapsed time, the step and its bar) is redrawn under the printed
    lines while the job runs.
    """

    def __init__(self, log_path: str, out=None, verbose: bool = False, tail_lines: int = TAIL_LINES):
        self.log_path = os.path.abspath(log_path)
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self._log = open(self.log_path, "a", encoding="utf-8")
        self._out = out if out is not None else sys.stdout
        self.verbose = verbose
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._pending = ""
        self._blocks: set[str | None] = set()  # sources inside a traceback
        self._failure: str | None = None
        self._failure_wanted: str | None = None  # the error Ray's header names, until its line comes
        self._failure_open = False  # inside a traceback whose exception lines may still be the failure
        self._total: int | None = None
        self._done = 0
        self._started = time.monotonic()
        self._live = not verbose and bool(getattr(self._out, "isatty", lambda: False)())
        self._status_shown = False
        self._status_at = 0.0
        self.lines = 0

    def note(self, text: str) -> None:
        """A line of the submitter's own, to the full log only (which job, when)."""
        self._log.write(text.rstrip("\n") + "\n")
        self._log.flush()

    def say(self, text: str) -> None:
        """A line of the submitter's own, to the console and the full log."""
        self._print(text)
        self.note(text)

    def write(self, chunk: str) -> None:
        lines = (self._pending + chunk).split("\n")
        self._pending = lines.pop()
        for line in lines:
            self._line(line)
        self._log.flush()
        self._status()

    def close(self) -> None:
        if self._pending:
            self._line(self._pending)
            self._pending = ""
        self._clear_status()
        self._log.close()

    def tail(self) -> list[str]:
        return list(self._tail)

    def failure(self) -> str | None:
        """The exception line of the last traceback in the stream, ``None`` without one: for Ray's rendering of a
        task's error (``RayTaskError(NodeLostError): ...``, its frames, its cause's rendering, the error's line, then
        its cause's traceback again), the line of the error the header names, not the cause's around it; for Python's
        chained tracebacks, the last (outermost) one."""
        return self._failure

    def _watch_failure(self, text: str) -> None:
        if _BLOCK_START.search(text):
            named = _RAY_TASK_ERROR.match(text)
            if named and self._failure_open and self._failure_wanted is not None:
                return  # Ray's rendering of the cause, nested in the error still awaited
            self._failure_wanted = named.group("name") if named else None
            self._failure_open = True
            return
        raised = _RAISED.match(text) if self._failure_open else None
        if raised and self._failure_wanted in (None, raised.group("name")):
            self._failure = text
            if self._failure_wanted is not None:
                self._failure_open = False  # what follows is its cause's traceback

    def _line(self, raw: str) -> None:
        raw = raw.rstrip("\r")
        clean = strip_ansi(raw)
        self.lines += 1
        self._log.write(clean + "\n")
        self._tail.append(clean)
        self._watch_failure(split_ray_prefix(clean)[1])
        if self.verbose:
            self._print(raw)
            return
        shown = self.console_line(clean)
        if shown is not None:
            self._print(shown)

    def console_line(self, line: str) -> str | None:
        """What the console shows for one (colourless) line of the stream, or ``None``."""
        source, text = split_ray_prefix(line)
        if source in self._blocks:
            inside = not text.strip() or text[:1] in (" ", "\t") or text.startswith(_BLOCK_GO_ON)
            if inside or _BLOCK_START.search(text):
                return line
            # Python's last line of a traceback: the exception and its message (a SystemExit or KeyboardInterrupt
            # too, which no error pattern names)
            self._blocks.discard(source)
            return line
        if _BLOCK_START.search(text):
            self._blocks.add(source)
            return line
        if text.startswith(PLACEMENT_PREFIX):
            return None  # the placement report's JSON, for tools: the log keeps it, its readable lines are shown
        if _TAG.search(text):
            return text
        if _ERROR.search(text) or (source or "").startswith(_RAY_OWN):
            return line
        progress = _PROGRESS.search(text)
        if progress:
            self._done, self._total = int(progress.group(1)), int(progress.group(2))
            return None
        parsed = parse_step_line(text)
        if parsed:
            step, metrics = parsed
            if "training/global_step" in metrics or STEP_TIME_KEY in metrics:
                self._done = step
            return step_summary(step, metrics, self._total)
        return None

    def _print(self, text: str) -> None:
        self._clear_status()
        print(text, file=self._out, flush=True)

    def _status(self) -> None:
        now = time.monotonic()
        if not self._live or now - self._status_at < 0.5:
            return
        self._status_at = now
        elapsed = int(now - self._started)
        text = f"  ... {elapsed // 60}:{elapsed % 60:02d}"
        if self._total:
            text += f"  step {self._done}/{self._total} {progress_bar(self._done, self._total)}"
        self._out.write("\r\x1b[K" + text)
        self._out.flush()
        self._status_shown = True

    def _clear_status(self) -> None:
        if self._status_shown:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._status_shown = False
