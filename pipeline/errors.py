"""Errors the user can act on: the CLI prints them on one line and exits non-zero."""

from __future__ import annotations


class PipelineError(Exception):
    """A problem with the user's input or environment, stated in one line."""


class GateError(PipelineError):
    """A validation gate failed: the flow stops and publishes nothing."""
