"""The preflight's quiet console: third-party chatter goes to the full log only, errors still reach the console."""

from __future__ import annotations

import io
import logging
import warnings

import pytest

from recipe.diva_grpo.console import ThirdPartyFilter, quiet_console, stdout_to


@pytest.fixture
def console():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.stream = stream
    root = logging.getLogger()
    root.addHandler(handler)
    noisy = logging.getLogger("transfer_queue.utils.common")
    own = logging.StreamHandler()  # TransferQueue gives its loggers a stderr handler of their own
    noisy.addHandler(own)
    yield stream, handler, noisy, own
    root.removeHandler(handler)
    noisy.removeHandler(own)
    for h in [h for h in root.handlers if getattr(h, "_diva_full_log", False)]:
        root.removeHandler(h)
        h.close()
    logging.captureWarnings(False)


def test_third_party_warnings_go_to_the_full_log_only(console, tmp_path, monkeypatch):
    stream, handler, noisy, own = console
    monkeypatch.setattr("recipe.diva_grpo.console._console_handlers", lambda: [handler, own])
    full_log = tmp_path / "preflight.log"
    quiet_console(str(full_log))
    noisy.warning("target_num_threads 8 should not exceed total physical CPU cores 2")
    noisy.error("storage unit failed")
    logging.getLogger("recipe.diva_grpo").warning("a warning of our own")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("engine is not available", UserWarning, stacklevel=1)
    shown = stream.getvalue()
    assert "target_num_threads" not in shown and "engine is not available" not in shown
    assert "storage unit failed" in shown and "a warning of our own" in shown
    logged = full_log.read_text()
    for text in ("target_num_threads", "storage unit failed", "a warning of our own", "engine is not available"):
        assert text in logged
    assert any(isinstance(f, ThirdPartyFilter) for f in own.filters)
    # a second preflight in the same process writes its own full log, not both
    quiet_console(str(tmp_path / "second.log"))
    noisy.warning("second run")
    assert "second run" not in full_log.read_text() and "second run" in (tmp_path / "second.log").read_text()


def test_print_output_goes_to_the_full_log_inside_the_block(tmp_path, capsys):
    full_log = tmp_path / "preflight.log"
    with stdout_to(str(full_log)):
        print("Initial validation metrics: {...}")
    print("[preflight] PASSED")
    assert capsys.readouterr().out == "[preflight] PASSED\n"
    assert "Initial validation metrics" in full_log.read_text()


def test_console_handlers_are_found_on_every_logger():
    import sys

    from recipe.diva_grpo.console import _console_handlers

    logger = logging.getLogger("some_library.deep.module")
    to_stderr, to_file = logging.StreamHandler(sys.stderr), logging.StreamHandler(io.StringIO())
    logger.addHandler(to_stderr)
    logger.addHandler(to_file)
    try:
        found = _console_handlers()
        assert to_stderr in found and to_file not in found
    finally:
        logger.removeHandler(to_stderr)
        logger.removeHandler(to_file)
