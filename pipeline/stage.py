"""What a compression method's `apply` receives besides the model and its config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from pipeline.encoding import Encoded


@dataclass
class StageContext:
    """The frozen dense teacher, the tokenised task data, and a report the method fills with its figures."""

    teacher: nn.Module
    train: Encoded
    dev: Encoded
    report: dict[str, Any] = field(default_factory=dict)
