"""Configuration of task distillation into a smaller student."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.compress.methods.distill import derived as rules
from pipeline.config.schema import FrozenModel, KeyStableModel, MethodConfig, TrainConfig
from pipeline.data.tasks import TaskSpec
from pipeline.errors import PipelineError
from pipeline.models.folders import check_model_dir, load_tokenizer

HiddenMapping = Literal["single", "last", "uniform", "uniform_cons", "uniform_last"]


class StudentConfig(KeyStableModel):
    """The student: a subset of the teacher's layers, optionally narrower, or a folder of its own.

    Attributes:
        layers: how many teacher layers to keep (picked by `pick`), or an explicit list of 0-based indices; None:
            half the teacher's, rounded up (`derived.student_layers`: MiniLM-L6's 3 of 6).
        pick: `uniform` (every k-th, ending with the last: 6 -> 3 keeps layers 2, 4, 6), `first`, or `last`.
        heads: attention heads kept per layer, the most important by weight norm (None: all).
        ffn: FFN neurons kept per layer, the most important by weight norm (None: all).
        path: a student folder (a classifier, or a bare encoder that gets a new head) instead of teacher layers;
            its tokenizer must equal the teacher's.
        activation: the student's FFN activation, swapped in before it trains (`relu`: FastFormers' swap; a
            gated FFN keeps its gate); None: the teacher's.
        hidden: a narrower hidden size, a multiple of the teacher's head size: heads are kept whole, so a layer
            keeps hidden / head size of them (the most important), and every tensor, the task head's too, keeps
            the hidden dimensions that carry the most weight (`general_student.sliced_to`); None: the teacher's.
    """

    layers: int | list[int] | None = None
    pick: Literal["uniform", "first", "last"] = "uniform"
    heads: int | None = Field(None, ge=1)
    ffn: int | None = Field(None, ge=1)
    path: str | None = None
    activation: Literal["relu", "gelu"] | None = None
    hidden: int | None = Field(None, ge=1)

    newer_defaults: ClassVar[dict[str, Any]] = {"activation": None, "hidden": None}


def pick_layers(n_teacher: int, cfg: StudentConfig) -> list[int]:
    """0-based teacher layers the student keeps, bottom to top."""
    if isinstance(cfg.layers, list):
        return sorted(cfg.layers)
    n = rules.student_layers(cfg.layers, n_teacher).value
    if not 1 <= n <= n_teacher:
        raise PipelineError(f"student layers {n} must be between 1 and the teacher's {n_teacher}")
    if cfg.pick == "first":
        return list(range(n))
    if cfg.pick == "last":
        return list(range(n_teacher - n, n_teacher))
    return [round((i + 1) * n_teacher / n) - 1 for i in range(n)]  # every k-th, ending with the top layer


RelationPair = Literal["QQ", "QK", "QV", "KQ", "KK", "KV", "VQ", "VK", "VV"]


class TransferLosses(FrozenModel):
    """The settings of the transfer losses task and general distillation share (see `DistillConfig`)."""

    relation: float = Field(1.0, ge=0)
    relation_heads: int | None = Field(None, ge=1)
    relation_pairs: list[RelationPair] = Field(default_factory=lambda: ["QQ", "KK", "VV"])
    teacher_layer: int | None = Field(None, ge=1)
    hidden: float = Field(0.0, ge=0)
    hidden_mapping: HiddenMapping = "uniform"


class DistillConfig(TransferLosses, MethodConfig):
    """Distillation into a smaller student: MiniLMv2 relations, hidden-state and output transfer.

    Papers: MiniLMv2 (arXiv 2012.15828): Q-Q, K-K, V-V self-attention relations of one teacher layer into the
    student's last layer, over `relation_heads` relation heads independent of either model's head count;
    the comparison of task-agnostic distillation methods (arXiv 2310.08797): hidden-state transfer through
    learned projections under five layer mappings, and output-distribution transfer.

    Loss = `relation` · L_relation + `hidden` · L_hidden + task loss, the task loss being
    (1 − `train.kd_alpha`) · CE + `train.kd_alpha` · T² · KL(teacher ‖ student) at `train.kd_temperature`.
    With `transfer_steps` > 0, training has two phases: first only the relation and hidden terms (no labels,
    no logits), then task fine-tuning with output KD for `train.max_steps`.

    Attributes:
        student: which student.
        relation: weight of the MiniLMv2 relation loss (0: off).
        relation_heads: A_r; must divide the teacher's and the student's Q/K/V widths (MiniLM-384: 48 -> 8 each).
            None: the paper's 48 (64 for a large teacher) where it divides both, else derived (`derived`).
        relation_pairs: which relations (the paper: QQ, KK, VV; any of the nine).
        teacher_layer: 1-based teacher layer whose relations are taken (None: the paper's upper-middle layer for
            24-layer BERT, RoBERTa and XLM-R teachers, else the last: `derived`); the student side is always its
            last layer.
        hidden: weight of the hidden-state MSE (0: off).
        hidden_mapping: which student layer learns which teacher layers (see `losses.layer_mapping`).
        transfer_steps: steps of the first phase (0: one joint phase).
        transfer_lr: learning rate of the first phase.
        train: the task phase (budget, optimiser, output KD).
    """

    name: ClassVar[str] = "distill"
    PHASE_STEPS: ClassVar[tuple[str, ...]] = ("transfer_steps",)

    student: StudentConfig = StudentConfig()
    transfer_steps: int = Field(300, ge=0)
    transfer_lr: float = Field(1e-4, gt=0)
    train: TrainConfig = TrainConfig(max_steps=600, epochs=3, lr=1e-4, kd_alpha=0.5, kd_temperature=2.0)

    @model_validator(mode="after")
    def _some_signal(self) -> DistillConfig:
        if self.transfer_steps and not (self.relation or self.hidden):
            raise ValueError(
                "transfer_steps needs a relation or hidden weight above 0 (the first phase has nothing else)"
            )
        return self

    def planned(
        self, layers: int, heads: int, ffn: int, teacher: dict[str, int], hidden: int | None = None
    ) -> DistillConfig | None:
        """The student at the planned depth and, when the plan narrowed it, hidden size (its heads and FFN
        neurons are the pruner's to set); None when every layer and the teacher's width stay. A student folder
        (`student.path`) keeps its own depth: the plan was made on its shape (`teacher` is then the student's)
        and prunes its heads and neurons."""
        if self.student.path is not None:
            if layers != teacher["layers"]:
                raise PipelineError(f"a student folder keeps its {teacher['layers']} layers; the plan chose {layers}")
            return self
        if layers == teacher["layers"] and hidden is None:
            return None  # the teacher's own depth and width: nothing to distill
        return self.updated(student={**self.student.model_dump(), "layers": layers, "hidden": hidden})

    def preflight(
        self, model_dir: Path, teacher_dir: Path | None, model_config: dict[str, Any], task: TaskSpec
    ) -> None:
        """Layer indices, relation heads and the student's vocabulary, before any stage runs."""
        from pipeline.models.families import arch_of

        arch = arch_of(model_config)
        n_teacher = arch.layers
        layers = self.student.layers
        if self.student.path is None:
            if isinstance(layers, int) and not 1 <= layers <= n_teacher:
                raise PipelineError(f"student layers {layers} must be between 1 and the teacher's {n_teacher}")
            if isinstance(layers, list) and (
                not layers or any(not 0 <= i < n_teacher for i in layers) or len(set(layers)) != len(layers)
            ):
                raise PipelineError(f"student layers {layers} must be distinct indices in [0, {n_teacher})")
            if self.student.heads is not None and self.student.heads > arch.heads:
                raise PipelineError(f"student heads {self.student.heads} exceed the teacher's {arch.heads}")
            if self.student.hidden is not None:
                check_narrower_hidden(self.student, arch, model_config["model_type"])
        rules.teacher_layer(self.teacher_layer, n_teacher, model_config["model_type"])
        student_config = model_config
        if self.student.path is not None:
            student_config = check_student_folder(Path(self.student.path), teacher_dir or model_dir)
        width = arch_of(student_config).hidden if self.student.path else (self.student.hidden or arch.hidden)
        if self.train.layer_kd and width != arch.hidden:
            raise PipelineError(
                f"train.layer_kd compares hidden states directly: the student's width {width} is not the "
                f"teacher's {arch.hidden} (`hidden` has projections)"
            )
        if self.relation:
            student_arch = arch_of(student_config)
            widths = [arch.heads * arch.head_dim, student_arch.heads * student_arch.head_dim]
            if self.student.heads is not None and self.student.path is None:
                widths[1] = self.student.heads * arch.head_dim
            if self.student.hidden is not None and self.student.path is None:
                widths[1] = self.student.hidden
            rules.relation_heads(self.relation_heads, *widths)
        if self.hidden:
            from pipeline.compress.methods.distill.losses import layer_mapping

            n_student = (
                arch_of(student_config).layers if self.student.path else rules.student_layers(layers, n_teacher).value
            )
            layer_mapping(self.hidden_mapping, n_teacher, n_student)


def check_narrower_hidden(student: StudentConfig, arch: Any, model_type: str) -> None:
    """A student hidden size the teacher can be narrowed to (heads kept whole, not with `heads` or `path`)."""
    from pipeline.models.families import family_for

    hidden = student.hidden
    if hidden > arch.hidden or hidden % arch.head_dim:
        raise PipelineError(
            f"student hidden {hidden} must be a multiple of the teacher's head size {arch.head_dim} up to its "
            f"{arch.hidden} (heads are kept whole)"
        )
    if student.heads is not None:
        raise PipelineError(f"student hidden {hidden} keeps {hidden // arch.head_dim} heads a layer: leave out heads")
    if hidden < arch.hidden and not family_for(model_type).narrows_from_teacher:
        raise PipelineError(
            f"a {model_type} student cannot be cut from its teacher at a narrower hidden size (its layers share one "
            "position-bias table over all heads): distil a general student with init random instead"
        )


def check_student_folder(path: Path, teacher_dir: Path) -> dict:
    """The student folder is a usable model whose tokenizer equals the teacher's; returns its config."""
    config = check_model_dir(path)
    student_tok, teacher_tok = load_tokenizer(path), load_tokenizer(teacher_dir)
    s_vocab, t_vocab = student_tok.get_vocab(), teacher_tok.get_vocab()
    if s_vocab != t_vocab:
        raise PipelineError(
            f"student {path} tokenizes differently from the teacher (vocabularies of {len(s_vocab)} and "
            f"{len(t_vocab)} tokens differ); relations and logits must be over the same tokens"
        )
    if _normalizer(student_tok) != _normalizer(teacher_tok):
        raise PipelineError(
            f"student {path} has the teacher's vocabulary but normalises text differently (e.g. lowercasing)"
        )
    return config


def _normalizer(tokenizer) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return json.loads(backend.to_str()).get("normalizer") if backend is not None else None


class StudentShape(FrozenModel):
    """A general student's uniform shape; None takes the teacher's (heads: hidden / the teacher's head size; ffn:
    the teacher's FFN ratio to its hidden size)."""

    layers: int = Field(4, ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    ffn: int | None = Field(None, ge=1)

    def resolved(self, teacher: dict[str, Any]) -> dict[str, int]:
        """{layers, hidden, heads, ffn} against the teacher's `config.json`."""
        from pipeline.models.families import arch_of

        arch = arch_of(teacher)
        hidden = self.hidden or arch.hidden
        heads = self.heads or max(1, hidden // arch.head_dim)
        ffn = self.ffn or round(arch.ffn * hidden / arch.hidden)
        return {"layers": self.layers, "hidden": hidden, "heads": heads, "ffn": ffn}


class GeneralConfig(TransferLosses):
    """Task-agnostic distillation of a pre-trained encoder into a general student, on unlabelled text.

    The losses are distill's (MiniLMv2 relations, hidden states through learned projections under a layer
    mapping) plus DirectMiniLM (eq. 10 of arXiv 2310.08797: the student's relation-head Q/K/V mapped onto the
    teacher's by learned per-head matrices, MSE), in any combination; there is no task loss and no label.

    Attributes:
        student: the student's shape.
        init: `teacher` (layers picked uniformly, heads, neurons and hidden dimensions kept by importance) or
            `random`.
        relation, relation_heads, relation_pairs, teacher_layer, hidden, hidden_mapping: as in distill.
        direct: weight of the DirectMiniLM loss (0: off); it uses `relation_heads` and `teacher_layer`.
        max_length: tokens per paragraph (longer ones are cut).
        corpus_lines: read at most this many non-blank lines of the corpus (None: all).
        train: budget and optimiser (its KD and evaluation settings are unused: there are no labels).
    """

    student: StudentShape = StudentShape()
    init: Literal["teacher", "random"] = "teacher"
    relation_heads: int | None = Field(None, ge=1)  # None: from the widths (`rules.relation_heads`)
    direct: float = Field(0.0, ge=0)
    max_length: int = Field(128, ge=8, le=4096)
    corpus_lines: int | None = Field(None, ge=1)
    train: TrainConfig = TrainConfig(max_steps=2000, epochs=1, batch_size=32, lr=2e-4, warmup_ratio=0.05)

    @model_validator(mode="after")
    def _some_signal(self) -> GeneralConfig:
        if not (self.relation or self.hidden or self.direct):
            raise ValueError("relation, hidden and direct are all 0: nothing to distil")
        if self.train.max_steps < 1:  # 0 would publish the cut teacher as if it had been distilled
            raise ValueError(
                f"train.max_steps must be at least 1 for general distillation, not {self.train.max_steps}"
            )
        if self.train.layer_kd:  # a task-phase loss: general distillation has no task phase
            raise ValueError(
                "train.layer_kd applies to task training; general distillation's hidden-state loss is `hidden`"
            )
        return self

    def preflight(self, teacher: dict[str, Any]) -> dict[str, int]:
        """The resolved student shape, after checking it against the teacher's `config.json`."""
        from pipeline.compress.methods.distill.losses import layer_mapping
        from pipeline.models.families import arch_of

        arch, shape = arch_of(teacher), self.student.resolved(teacher)
        if self.init == "teacher":
            for key, limit in (
                ("layers", arch.layers),
                ("hidden", arch.hidden),
                ("heads", arch.heads),
                ("ffn", arch.ffn),
            ):
                if shape[key] > limit:
                    raise PipelineError(f"student {key} {shape[key]} exceeds the teacher's {limit} (init teacher)")
            if shape["heads"] * arch.head_dim != shape["hidden"]:
                raise PipelineError(
                    f"student heads {shape['heads']} x the teacher's head size {arch.head_dim} != hidden "
                    f"{shape['hidden']}: heads are kept whole (init teacher); use heads "
                    f"{shape['hidden'] // arch.head_dim} or init random"
                )
        if shape["hidden"] % shape["heads"]:
            raise PipelineError(f"student hidden {shape['hidden']} is not a multiple of its heads {shape['heads']}")
        self.derived(teacher)
        if self.hidden:
            layer_mapping(self.hidden_mapping, arch.layers, shape["layers"])
        return shape

    def derived(self, teacher: dict[str, Any]) -> dict[str, rules.Resolved]:
        """The relation heads and teacher layer for this teacher and student (`rules`), each with its source."""
        from pipeline.models.families import arch_of

        arch, shape = arch_of(teacher), self.student.resolved(teacher)
        out = {"teacher_layer": rules.teacher_layer(self.teacher_layer, arch.layers, teacher["model_type"])}
        if self.relation or self.direct:
            width = arch.heads * arch.head_dim
            out["relation_heads"] = rules.relation_heads(self.relation_heads, width, shape["hidden"])
        return out
