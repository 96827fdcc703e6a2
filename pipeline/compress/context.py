"""What a compression method's `apply` receives besides the model and its config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from pipeline.data.tasks import TaskSpec
from pipeline.kinds.base import Encoded


@dataclass
class StageContext:
    """The frozen dense teacher, the tokenised train and validation splits (dev, the test, is never given to a
    method), and a report the method fills with its figures.

    `base_model` (the pre-trained folder the teacher came from, when known) and `task` let a method start
    from somewhere else than the teacher, e.g. SMP's verbalizer head on the pre-trained weights.

    `teacher_outputs` answers output-only KD from rows computed once per input (`pipeline.train.teacher_outputs`);
    `kd_teacher` is what a method distils its outputs from: those rows where there are, else the teacher.
    """

    teacher: nn.Module
    train: Encoded
    validation: Encoded
    task: TaskSpec | None = None
    base_model: str | None = None
    report: dict[str, Any] = field(default_factory=dict)
    teacher_outputs: nn.Module | None = None

    @property
    def kd_teacher(self) -> nn.Module:
        return self.teacher_outputs if self.teacher_outputs is not None else self.teacher
