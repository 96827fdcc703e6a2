"""Errors the user can act on: the CLI prints them on one line and exits non-zero."""

from __future__ import annotations


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


class PipelineError(Exception):
    """A problem with the user's input or environment, stated in one line."""


class GateError(PipelineError):
    """A validation gate failed: the flow stops and publishes nothing."""
