"""What is installed, read from package metadata (nothing is imported): the few places that must differ between
transformers 4 and 5, or with and without optimum-onnx, ask here."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version


@functools.cache
def transformers_5() -> bool:
    """The installed transformers is 5.x or later. 5.x unpacks every attention module's output as a pair, keeps no
    head count on some attentions, types ModernBERT's layers in its config, traces attention reshapes with -1 heads,
    validates config fields as it builds them and has no question-answering pipeline."""
    return int(version("transformers").split(".")[0]) >= 5


def question_answering_pipeline() -> bool:
    """transformers has its question-answering pipeline (5.x removed it)."""
    return not transformers_5()


@functools.cache
def optimum_onnx() -> bool:
    """optimum-onnx is installed: Optimum's `ORTModelFor*` classes and sentence-transformers' ONNX backend load
    through it. Its releases so far require transformers < 4.58; the project's artifacts never need it."""
    try:
        version("optimum-onnx")
    except PackageNotFoundError:
        return False
    return True
