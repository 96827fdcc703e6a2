"""Errors the user can act on: the CLI prints them on one line and exits non-zero."""

from __future__ import annotations

import logging
import os


def debugging() -> bool:
    """PIPELINE_DEBUG=1: errors keep their whole tracebacks (the CLI re-raises, Prefect's logs keep them)."""
    return os.environ.get("PIPELINE_DEBUG") == "1"


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


class PipelineError(Exception):
    """A problem with the user's input or environment, stated in one line."""


class GateError(PipelineError):
    """A validation gate failed: the flow stops and publishes nothing."""


class _UserErrorWithoutTraceback(logging.Filter):
    """Drops the traceback from a log record of a PipelineError, keeping its message: Prefect logs a failed task's
    and flow's exception with `exc_info`, so a refused target or a failed gate printed two library tracebacks above
    the CLI's one-line error. Other exceptions (our bugs, a library's) keep theirs, and PIPELINE_DEBUG=1 keeps all,
    as it does in the CLI."""

    def filter(self, record: logging.LogRecord) -> bool:
        user_error = record.exc_info and isinstance(record.exc_info[1], PipelineError)
        if user_error and not debugging():
            record.exc_info = record.exc_text = None
        return True


def quiet_prefect_user_errors() -> None:
    """Log PipelineErrors raised in Prefect tasks and flows without their tracebacks; idempotent, and needs no
    Prefect import (Prefect configures these loggers by name and keeps their filters)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorWithoutTraceback) for f in logger.filters):
            logger.addFilter(_UserErrorWithoutTraceback())
