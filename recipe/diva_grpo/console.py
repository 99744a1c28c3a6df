"""Keep third-party chatter out of the preflight's console, so its summary and any error stand out.

TransferQueue warns on every batch operation that its thread count exceeds this machine's physical cores (hundreds
of identical lines in a CPU preflight, from the driver and from each storage actor), and verl, torch and torchdata
emit warnings that ask nothing of the user. :func:`quiet_console`:

- writes every log record (and every Python warning, through ``logging.captureWarnings``) to a full log file;
- drops, from the console handlers only, records below ERROR of the loggers in :data:`QUIET_LOGGERS`;
- turns off the ``datasets`` progress bars (two per dataset load);

and :func:`stdout_to` sends ``print`` output to the same file while verl trains.

The Ray side is the caller's: ``ray.init(log_to_driver=False)`` keeps the actors' output in Ray's session logs
instead of echoing it. Errors are never filtered: an exception still ends the preflight with its message.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager, redirect_stdout

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


def _console_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    handlers = []
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream in (sys.stdout, sys.stderr, sys.__stderr__):
                handlers.append(handler)
    return handlers


def quiet_console(full_log: str) -> logging.Handler:
    """Apply the filtering to every console handler that exists now; returns the full log's file handler.

    Call it after the noisy libraries are imported (their loggers and handlers exist from import on); calling it
    again later covers loggers created since.
    """
    logging.captureWarnings(True)
    root = logging.getLogger()
    full_log = os.path.abspath(full_log)
    handler = None
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        if old.baseFilename == full_log:
            handler = old
        else:  # an earlier preflight's log in the same process (tests): one full log at a time
            root.removeHandler(old)
            old.close()
    if handler is None:
        handler = logging.FileHandler(full_log, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FULL_LOG_FORMAT))
        setattr(handler, _MARK, True)
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    for console in _console_handlers():
        if not any(isinstance(f, ThirdPartyFilter) for f in console.filters):
            console.addFilter(ThirdPartyFilter())
    try:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except ImportError:
        pass
    return handler


@contextmanager
def stdout_to(full_log: str):
    """Send ``print`` output to ``full_log`` inside the block (verl prints whole validation-metric dicts, hundreds
    of lines, at the start and end of ``fit``); log records and progress bars still reach the console."""
    with open(full_log, "a", encoding="utf-8") as handle, redirect_stdout(handle):
        yield
