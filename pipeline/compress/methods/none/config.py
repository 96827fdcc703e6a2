"""Configuration of the `none` method: nothing to configure."""

from __future__ import annotations

from typing import ClassVar

from pipeline.config.schema import MethodConfig


class NoneConfig(MethodConfig):
    """No compression: the dense teacher through the same export, int8, gates and benchmark (the dense-int8 baseline).

    What a user gets from a one-command dense int8 export; every compressed artifact is weighed against it. The
    `train` section is unused (nothing trains).
    """

    name: ClassVar[str] = "none"
