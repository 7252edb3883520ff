"""Console output outside a terminal: whole log lines and plain progress lines."""

import io
import logging

import pytest
from rich.console import Console

from vascl_scale import log


@pytest.fixture
def file_console(monkeypatch):
    """The shared console writing into a string, as into a log file (not a terminal)."""
    target = io.StringIO()
    monkeypatch.setattr(log, "console", Console(file=target))
    yield target
    root = logging.getLogger("vascl_scale")
    root.handlers[:] = []
    root.propagate = True


def test_log_records_outside_a_terminal_are_whole_timestamped_lines(file_console):
    log.setup_logging("INFO")
    long_message = "encoded " + " ".join(f"word{i}" for i in range(40))  # far past 80 columns
    logging.getLogger("vascl_scale.test").info(long_message)
    logging.getLogger("vascl_scale.test").debug("not at INFO")
    (line,) = file_console.getvalue().splitlines()
    date, clock, level, message = line.split(" ", 3)
    assert len(date) == 10 and len(clock) == 8 and level == "INFO" and message == long_message


def _collect(logger_name: str) -> tuple[logging.Logger, list[str]]:
    messages: list[str] = []
    collector = logging.Handler(logging.INFO)
    collector.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(logger_name)
    logger.addHandler(collector)
    logger.setLevel(logging.INFO)
    return logger, messages


def test_loop_progress_logs_plain_lines_with_the_note_and_time_left(file_console, monkeypatch):
    monkeypatch.setattr(log, "PLAIN_PROGRESS_SECONDS", 0.0)
    logger, messages = _collect("vascl_scale.log")
    try:
        with log.LoopProgress("train", 40, "steps", completed=10) as progress:  # resumed at step 10
            progress.update(10)  # nothing done in this invocation yet: no rate, no line
            progress.update(20, note="loss 1.84 | 21.8 sent/s")
            progress.update(30)
    finally:
        logger.handlers.clear()
    assert len(messages) == 2, messages
    assert messages[0].startswith("train: 20 of 40 steps, ") and messages[0].endswith("left | loss 1.84 | 21.8 sent/s")
    assert (
        messages[1].startswith("train: 30 of 40 steps, ")
        and " steps/s, " in messages[1]
        and "elapsed, about 0:00:0" in messages[1]
    )


def test_loop_progress_lines_are_rate_limited_and_absent_on_a_terminal(file_console, monkeypatch):
    logger, messages = _collect("vascl_scale.log")
    try:
        with log.LoopProgress("encoding", 100, "texts") as progress:  # PLAIN_PROGRESS_SECONDS apart: none in a moment
            for done in range(1, 101):
                progress.update(done)
        monkeypatch.setattr(log, "PLAIN_PROGRESS_SECONDS", 0.0)
        monkeypatch.setattr(log, "console", Console(file=io.StringIO(), force_terminal=True))
        with log.LoopProgress("encoding", 100, "texts") as progress:  # a terminal: the bar, no lines
            progress.update(50)
    finally:
        logger.handlers.clear()
    assert messages == []
