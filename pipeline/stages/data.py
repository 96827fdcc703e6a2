"""The data stage: load the task's data once to validate and fingerprint it, and say which source was used."""

from __future__ import annotations

import logging

from pipeline.data.loaders import DataRef

log = logging.getLogger(__name__)


def run(ref: DataRef) -> dict:
    """The data's description (source, sizes, the validation split's seed and digest); every problem is raised now."""
    data = ref.load()
    log.info(
        "data: %s (%d train, %d validation carved from train, %d dev)",
        data.source,
        len(data.train),
        len(data.validation),
        len(data.dev),
    )
    return data.describe()
