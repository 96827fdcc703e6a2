"""The data stage: load the task's data once to validate and fingerprint it, and say which source was used."""

from __future__ import annotations

import logging

from pipeline.data.loaders import DataRef
from pipeline.data.phrases import LEAK_WARNING

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
    description = data.describe()
    if data.auto_chose is not None:
        detail = {
            "document": f"; {description['validation_split'].get('documents')} of them drawn",
            "sentence": f"; {data.dropped_from_train} training phrases of them left train",
        }.get(data.validation_unit, "")
        log.info(
            "data: validation holds out whole %ss (data.validation_unit auto): %s%s",
            data.validation_unit,
            data.auto_chose,
            detail,
        )
    share = data.random_slice_inside  # measured once, by the loader that carved the split
    if data.validation_unit == "example" and share is not None and share > LEAK_WARNING:
        log.warning(
            "data: %.0f%% of the validation texts occur inside training texts (phrases of the same sentences): "
            "validation will flatter models that memorise; data.validation_unit sentence (or auto, the "
            "default) holds out whole sentences",
            100 * share,
        )
    return description
