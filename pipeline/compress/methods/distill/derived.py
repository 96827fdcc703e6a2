"""What distillation derives from the shapes of teacher and student, as MiniLMv2 (arXiv 2012.15828) does.

Three settings used to be fixed constants that only MiniLM-L6 fits (48 relation heads, a 3-layer student, the
teacher's last layer); each is now resolved from the shapes unless the recipe or `--set` gives it:

- relation heads: the paper's count, 48 for a base-size teacher and 64 for a large one (a Q/K/V width of 1,024 or
  more), where it divides the Q/K/V widths of both teacher and student; otherwise the common divisor whose relation
  head size (the teacher's width over it) is nearest the paper's 16 (768 / 48 and 1,024 / 64), more heads on a tie.
  At least two heads of at least two dimensions each: a prime width has no such divisor and is refused.
- the teacher layer: the paper's upper-middle layer for 24-layer teachers of the families it names (BERT-large 21,
  RoBERTa-large and XLM-R-large 19, 1-based); the last layer otherwise, as the paper does for its 12-layer
  base-size teachers. Deep teachers of other families get the last layer too: the paper measured no layer for them.
- the student's depth: half the teacher's layers, rounded up (MiniLM-L6's 3 of 6; bert-tiny's 1 of 2).

Each resolved value says where it came from: `set` (the recipe or `--set`), `paper` (the paper's rule applies as
written) or `derived` (the fallbacks above).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import PipelineError

PAPER_HEADS = {"base": 48, "large": 64}
LARGE_WIDTH = 1024  # a Q/K/V width from which a teacher counts as large (BERT-large, RoBERTa-large: 1,024)
PAPER_HEAD_SIZE = 16  # the paper's relation head size in both settings
# 1-based upper-middle teacher layers of 24-layer teachers (the paper's large-teacher experiments)
UPPER_MIDDLE = {"bert": 21, "roberta": 19, "xlm-roberta": 19}
PAPER_DEPTH = 24


@dataclass(frozen=True)
class Resolved:
    value: int
    source: str  # "set", "paper" or "derived"

    def as_dict(self) -> dict:
        return {"value": self.value, "from": self.source}


def as_report(resolved: dict[str, Resolved]) -> dict[str, dict]:
    """Resolved values as a report records them: {name: {"value", "from"}}."""
    return {name: r.as_dict() for name, r in resolved.items()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def usable_heads(widths: tuple[int, ...]) -> list[int]:
    """Relation head counts that divide every width, with at least two heads of at least two dimensions each."""
    common = set(_divisors(min(widths)))
    return sorted(d for d in common if d >= 2 and all(w % d == 0 and w // d >= 2 for w in widths))


def relation_heads(given: int | None, teacher_width: int, student_width: int) -> Resolved:
    """The relation heads for Q/K/V widths `teacher_width` and `student_width` (`given`: the recipe's or the user's
    value, which must divide both)."""
    widths = (teacher_width, student_width)
    usable = usable_heads(widths)
    if given is not None:
        if any(w % given for w in widths):
            wanted = f"values that divide both: {', '.join(map(str, usable))}" if usable else "no value divides both"
            raise PipelineError(
                f"relation heads {given} do not divide the Q/K/V widths {teacher_width} (teacher) and "
                f"{student_width} (student); {wanted} (leave relation_heads unset to derive it)"
            )
        return Resolved(given, "set")
    paper = PAPER_HEADS["large" if teacher_width >= LARGE_WIDTH else "base"]
    if paper in usable:
        return Resolved(paper, "paper")
    if not usable:
        raise PipelineError(
            f"no relation head count divides the Q/K/V widths {teacher_width} (teacher) and {student_width} "
            "(student) into at least two heads of two dimensions or more (a prime width has none): give the "
            "student another width, or turn relations off (relation=0)"
        )
    best = min(usable, key=lambda d: (abs(teacher_width / d - PAPER_HEAD_SIZE), -d))
    return Resolved(best, "derived")


def teacher_layer(given: int | None, layers: int, model_type: str) -> Resolved:
    """The 1-based teacher layer whose relations are distilled (`given`: set, within 1..layers)."""
    if given is not None:
        if not 1 <= given <= layers:
            raise PipelineError(
                f"teacher_layer {given} is out of range: the teacher has {layers} layers (1 to {layers}; unset: "
                f"{teacher_layer(None, layers, model_type).value})"
            )
        return Resolved(given, "set")
    if layers == PAPER_DEPTH and model_type in UPPER_MIDDLE:
        return Resolved(UPPER_MIDDLE[model_type], "paper")
    return Resolved(layers, "paper" if layers == 12 else "derived")  # the paper's base-size teachers: 12 layers


def student_layers(given: int | list[int] | None, teacher_layers: int) -> Resolved:
    """How many layers the student keeps (`given`: a count or the list of teacher layers; None: half)."""
    if given is None:
        return Resolved((teacher_layers + 1) // 2, "derived")  # half, rounded up: 6 -> 3, 2 -> 1, 24 -> 12
    return Resolved(given if isinstance(given, int) else len(given), "set")
