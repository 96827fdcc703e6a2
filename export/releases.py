"""Which release line of a library is installed, read from its metadata (nothing is imported): the few places that
must differ between transformers 4 and 5 ask here."""

from __future__ import annotations

import functools
from importlib.metadata import version


@functools.cache
def transformers_5() -> bool:
    """The installed transformers is 5.x or later. 5.x unpacks every attention module's output as a pair, keeps no
    head count on some attentions, types ModernBERT's layers in its config, traces attention reshapes with -1 heads,
    validates config fields as it builds them and has no question-answering pipeline."""
    return int(version("transformers").split(".")[0]) >= 5
