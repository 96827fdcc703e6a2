"""The configuration schema: frozen pydantic models that reject unknown keys.

A deploy configuration (`pipeline.compress.deploy_config.DeployConfig`) is read from a YAML recipe
(`pipeline.config.recipes`) plus CLI overrides, from the sections defined here and one config class per method of
its chain (`pipeline.compress.registry`). A typo anywhere fails loudly instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from pipeline.errors import PipelineError
from pipeline.kinds import BY_NAME, KIND_NAMES
from serving.artifact import SEQUENCE

# Sizes with a physical range, checked when a recipe is read: a batch of 0 crashed ONNX Runtime natively (SIGFPE)
# after a whole training run. Sequence lengths are also held to the model's positions by the request.
BatchSize = Annotated[int, Field(ge=1, le=4096)]
SeqLen = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Depth = Annotated[int, Field(ge=1)]


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


UNCAPPED_EPOCHS = 1e9  # a phase's step count is its whole budget, however small the training set


class KeyStableModel(FrozenModel):
    """A config whose fields added after stages were cached (`newer_defaults`: field -> default) are left out of
    its serialised form while at their defaults, so those stages keep their cache keys."""

    newer_defaults: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _newer_defaults_unsaid(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key, default in self.newer_defaults.items():
            if key in data and data[key] == default:  # absent when dumped with include= (Prefect does)
                del data[key]
        return data


class AugmentConfig(FrozenModel):
    """Augmented training sentences for output KD (TinyBERT's word replacement; see `pipeline.train.augment`).

    Attributes:
        copies: augmented sentences per training example, added to the training split without labels (the
            teacher's outputs are their targets; the label loss skips them).
        p: chance that a word is replaced, when it has neighbours.
        neighbours: a word is replaced by one of its this many nearest words, by the cosine of the teacher's input
            embeddings, among the one-token words of the training texts.
        seed: draws the replacements.
    """

    copies: int = Field(1, ge=1, le=50)
    p: float = Field(0.4, gt=0, le=1)
    neighbours: int = Field(15, ge=1, le=200)
    seed: int = 0


class TrainConfig(KeyStableModel):
    """Budget and optimiser of the shared training loop.

    Attributes:
        max_steps: hard cap on optimiser steps (the CPU-friendly budget); 0 skips training.
        epochs: passes over the training set, capped by `max_steps`.
        batch_size: examples per step.
        lr: peak AdamW learning rate.
        weight_decay: AdamW decay, not applied to biases and LayerNorm weights.
        warmup_ratio: fraction of each learning-rate cycle spent in linear warm-up before linear decay to 0.
        cycles: the warm-up + decay schedule repeated back to back this many times (GMP*'s re-warming).
        max_length: tokens per example after truncation (batches are padded to their longest example).
        eval_every: evaluate on the validation split every N steps (0: only at the end).
        kd_alpha: weight of the distillation term against the teacher's logits (0: hard labels only).
        kd_temperature: softmax temperature of the distillation term.
        layer_kd: weight of the hidden-state MSE of every layer to a teacher layer, added to the loss (0: off):
            the same layer for students of the teacher's depth (pruning, MLP Fusion), the uniform mapping for a
            shallower one (a distilled student, and SMP's recovery after it); the widths must be the teacher's
            (`distill`'s own hidden-state transfer, `config.hidden`, has projections).
        seed: seeds data order, dropout and initialisation.
        device: `auto` (CUDA when present), `cpu` or `cuda`.
        precision: `fp32`, or `bf16` mixed precision (autocast: matmuls in bfloat16, weights, optimiser and the
            losses' softmaxes in float32); 1.8x faster training steps on a CPU with AVX-512 BF16 at 12 x 768. Left
            out of the serialised config while `fp32`, so the cache keys of fp32 stages stay what they were.
            `auto`: bf16 where it is fast (a GPU, or a CPU with native bfloat16), fp32 elsewhere, decided when the
            config is read, so the config, the cache keys and the report hold what the steps ran in.
        group_by_length: batch examples of similar length together (within spans of 50 batches, the batches then
            shuffled), so batches pad less; left out of the serialised config while off, as `precision` is.
        augment: add augmented, unlabelled copies of the training sentences, distilled from the teacher's outputs
            (sentence tasks; needs `kd_alpha` > 0); None: the training split as it is.
        fake_quant_steps: the stage's last N training steps see the int8 graph's rounding of every linear's weight
            and input (quantisation-aware training, `pipeline.train.fake_quant`); in a stage of several phases,
            the last phase's (SMP: recovery; distill and MLP Fusion: task training). 0: off.
        average_steps: the stage's last phase ends on the mean of its weights after each of its last N steps
            (tail averaging, as stochastic weight averaging does: the mean of nearby iterates sits nearer the
            middle of the minimum than the last one; `pipeline.train.loop.TailAverage`). 0: the last step's weights.
    """

    max_steps: int = Field(300, ge=0)
    epochs: float = Field(3.0, gt=0)
    batch_size: BatchSize = 32
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    cycles: int = Field(1, ge=1)
    max_length: int = Field(128, ge=8)
    eval_every: int = Field(0, ge=0)
    kd_alpha: float = Field(0.0, ge=0, le=1)
    kd_temperature: float = Field(2.0, gt=0)
    layer_kd: float = Field(0.0, ge=0)
    seed: int = 0
    device: str = Field("auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$")
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    group_by_length: bool = False
    augment: AugmentConfig | None = None
    fake_quant_steps: int = Field(0, ge=0)
    average_steps: int = Field(0, ge=0)

    LAST_PHASE: ClassVar[tuple[str, ...]] = ("fake_quant_steps", "average_steps")  # a stage's last phase's only
    newer_defaults: ClassVar[dict[str, Any]] = {
        "precision": "fp32",
        "group_by_length": False,
        "augment": None,
        "fake_quant_steps": 0,
        "average_steps": 0,
    }

    @model_validator(mode="before")
    @classmethod
    def _auto_precision(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("precision") == "auto":
            from pipeline.devices import fast_precision  # torch: only for a config that asks

            return {**data, "precision": fast_precision(str(data.get("device", "auto")))}
        return data

    @model_validator(mode="after")
    def _augment_needs_kd(self) -> TrainConfig:
        if self.augment is not None and self.kd_alpha == 0:
            raise ValueError("train.augment adds sentences without labels: it needs kd_alpha above 0 (output KD)")
        return self

    def phase(self, max_steps: int, lr: float, last: bool = False, **updates: Any) -> TrainConfig:
        """This budget's settings for a sub-phase of exactly `max_steps` steps at `lr` (no epoch cap applies);
        only the stage's `last` phase keeps fake int8 and tail averaging."""
        base = self if last else self.before_last_phase()
        return base.model_copy(update={"max_steps": max_steps, "lr": lr, "epochs": UNCAPPED_EPOCHS, **updates})

    def before_last_phase(self) -> TrainConfig:
        """This budget for a phase that another follows: without the last phase's fake int8 and averaging."""
        return self.model_copy(update=dict.fromkeys(self.LAST_PHASE, 0))


class MethodConfig(FrozenModel):
    """Base of every method's configuration; `name` is the registry key."""

    name: ClassVar[str]
    train: TrainConfig = TrainConfig()
    # the fields holding the step counts of the method's phases besides `train.max_steps` (`--steps` sets them too)
    PHASE_STEPS: ClassVar[tuple[str, ...]] = ()

    def preflight(self, model_dir: Path, teacher_dir: Path | None, model_config: dict[str, Any], task: Any) -> None:
        """Check the config against the base model folder, the teacher folder when given (its config in
        `model_config`, else the base model's) and the task (a `pipeline.data.tasks.TaskSpec`), before any stage
        runs; raise PipelineError."""

    def planned(
        self, layers: int, heads: int, ffn: int, teacher: dict[str, int], hidden: int | None = None
    ) -> MethodConfig | None:
        """This stage's config for a shape planned by `--target-speedup` (`layers` of `heads` heads and `ffn` FFN
        neurons; `teacher` has the layers, heads and ffn the chain prunes from: the dense teacher's, or at a
        narrower `hidden` size, the narrowed student's), or None when the shape leaves the stage nothing to do. A
        method that neither sets depth nor width nor prunes units keeps its config."""
        return self

    def updated(self, **changes: Any) -> MethodConfig:
        """A copy with `changes` applied to its fields, validated again (model_copy would skip the validators)."""
        return type(self).model_validate({**self.model_dump(), **changes})


FfnGranularity = Literal["unstructured", "block", "neuron", "none"]
AttentionGranularity = Literal["unstructured", "block", "head", "none"]
Allocation = Literal["local", "type", "global", "soft"]


class UnitCounts(FrozenModel):
    """Heads and FFN neurons kept in every layer (a shape planned for a speed target)."""

    heads: int = Field(ge=0)
    ffn: int = Field(ge=0)


class MaskConfig(FrozenModel):
    """What a pruning method masks and how the kept budget is shared (see `pipeline.compress.masking`).

    Attributes:
        ffn: FFN granularity: `neuron` (compaction removes it), `block`, `unstructured`, or `none`.
        attention: attention granularity: `head` (compaction removes it), `block`, `unstructured`, or `none`.
        block: rows x columns of a block; must divide every masked matrix.
        allocation: top-k per score tensor (`local`: per matrix, or per layer for neurons/heads), per kind
            pooled over layers (`type`), over everything (`global`), or SMP-S's soft per-layer split (`soft`).
        soft_temperature: SMP-S's p in σ(S/p) (the authors' code; 1 = the paper).
        shape: heads and FFN neurons kept in each layer, the most important by the method's scores (replaces
            `sparsity` and `allocation`; set by `--target-speedup`). Needs `head` and `neuron` granularity.
    """

    ffn: FfnGranularity = "neuron"
    attention: AttentionGranularity = "head"
    block: tuple[int, int] = (32, 32)
    allocation: Allocation = "local"
    soft_temperature: float = Field(1.0, gt=0)
    shape: UnitCounts | None = None

    @model_validator(mode="after")
    def _shape_needs_units(self) -> MaskConfig:
        if self.shape is not None and (self.ffn, self.attention) != ("neuron", "head"):
            raise ValueError("mask.shape needs ffn: neuron and attention: head granularity")
        return self

    @property
    def allocation_used(self) -> Allocation:
        """`allocation`, except that a planned shape fixes every layer's own counts (local top-k)."""
        return self.allocation if self.shape is None else "local"

    @property
    def structured(self) -> bool:
        return self.ffn in ("neuron", "none") and self.attention in ("head", "none")

    def check_shapes(self, hidden: int, inter: int) -> None:
        """Blocks must tile every masked matrix of a model of width `hidden` and FFN width `inter`."""
        if "block" not in (self.ffn, self.attention):
            return
        r, c = self.block
        shapes = []
        if self.attention == "block":
            shapes.append(("attention", hidden, hidden))
        if self.ffn == "block":
            shapes += [("FFN input", inter, hidden), ("FFN output", hidden, inter)]
        for what, rows, cols in shapes:
            if rows and cols and (rows % r or cols % c):
                raise PipelineError(f"block {r}x{c} does not divide the {what} matrices ({rows}x{cols})")


class DataLimits(KeyStableModel):
    """The validation split carved from train, and caps on examples.

    Attributes:
        validation_size, validation_fraction: the validation split is min(size, fraction x train) examples of
            the source's train file (but at least min(250, a quarter of train), so a gate has resolution), drawn
            with `validation_seed` before `max_train` applies. Every choice a run makes (gates, checkpoints,
            recipe tuning) uses it; dev is only reported.
        validation_unit: `example` (a random slice), `sentence` (single-text tasks whose train set holds phrases
            of its sentences, as SST-2's does: validation draws only texts that occur inside no other training
            text, and the training texts inside a drawn one leave train; `pipeline.data.phrases`), or `auto` (the
            default): `document` where the training file marks documents (CoNLL's `-DOCSTART-`), `sentence` where
            more than `LEAK_WARNING` of a random slice's texts sit inside training texts (SST-2: 0.86), else
            `example`. `document` draws whole documents (a document's sentences name the same entities).
        max_train: a seeded random subset of the rest of train.
        max_dev: the first N of dev.
        corpus_lines: of a `--corpus` (unlabelled sentences for a sentence-embedding task's training split), the
            first this many lines.
    """

    validation_size: int = Field(2000, ge=1)
    validation_fraction: float = Field(0.1, gt=0, lt=1)
    validation_seed: int = 0
    validation_unit: Literal["auto", "example", "sentence", "document"] = "auto"
    max_train: int | None = Field(None, ge=1)
    max_dev: int | None = Field(None, ge=1)
    corpus_lines: int = Field(20_000, ge=1)

    # `auto` left unsaid: data that does not leak resolves it to `example`, the old default, whose configs said
    # nothing either, so their cached stages keep their keys; leaking data and files of documents get another split,
    # so another key
    newer_defaults: ClassVar[dict[str, Any]] = {"validation_unit": "auto", "corpus_lines": 20_000}

    @property
    def validation(self) -> tuple[int, float, int, str]:
        return (self.validation_size, self.validation_fraction, self.validation_seed, self.validation_unit)


class BenchSettings(FrozenModel):
    """ONNX Runtime latency grid and stopping rules.

    Attributes:
        batch_sizes, seq_lens: the grid of input shapes timed.
        warmup: untimed runs per model per cell.
        min_runs: timed runs per model always done.
        max_runs: upper bound on timed runs per model.
        max_seconds_per_cell: stop a cell once this wall time is spent (after min_runs).
        threads: intra-op threads; None means physical cores.
        providers: execution providers to run; None means CPU, plus CUDA when available.
        busy_cores: the machine counts as busy when other processes held more than this many cores on average
            while timing, beyond the physical cores the benchmark leaves idle (`export.benchmark.is_busy`).
        real_length_rounds: passes over the dev set's real inputs (the first `real_length_examples`, in order,
            batched at the headline batch size and padded per batch as the server pads), timed beside the fixed
            shapes; 0: not timed.
        passes: the headline cell (the speed target's input shape), and a speed target's shape checks, are timed in
            this many passes of a cell each, one after another; the speedup is the median of the passes' ratios.
            One pass's ratio spread by ±5% on a quiet shared 2-core VM, eight passes' median by 1-2% within
            minutes; over tens of minutes the VM's ratio itself moved 3-5% (docs/results.md, "Speed that lands
            where planned").
    """

    batch_sizes: tuple[BatchSize, ...] = Field((1, 8, 32), min_length=1)
    seq_lens: tuple[SeqLen, ...] = Field((32, 128), min_length=1)
    warmup: int = Field(5, ge=0)
    min_runs: int = Field(10, ge=1)
    max_runs: int = Field(100, ge=1)
    max_seconds_per_cell: float = Field(6.0, gt=0)
    threads: int | None = Field(None, ge=1)
    providers: tuple[str, ...] | None = None
    busy_cores: float = Field(0.25, ge=0, le=1024)
    passes: int = Field(8, ge=1, le=100)
    real_length_rounds: int = Field(3, ge=0, le=100)
    real_length_examples: int = Field(1000, ge=1)


class Gates(KeyStableModel):
    """Validation thresholds; a failed gate stops the flow and publishes nothing."""

    compaction_atol: float = 1e-5
    onnx_atol: float = 1e-4
    onnx_min_cosine: float = Field(
        0.9999, ge=-1, le=1, description="embeddings: the least cosine of an ONNX fp32 vector to torch's (per text)"
    )
    int8_max_drop: float = Field(
        1.0, ge=0, description="points of the task's metric int8 may lose against ONNX fp32 (validation split)"
    )
    max_metric_drop: float = Field(
        3.0,
        ge=0,
        description="points of the task's metric the compressed model may lose against its teacher (validation split)",
    )
    fp16_max_drop: float = Field(
        0.5, ge=0, description="points of the task's metric the fp16 graph (CUDA's) may lose against ONNX fp32"
    )
    fp16_min_agreement: float = Field(
        0.99, ge=0, le=1, description="the fp16 graph's argmax agreement with ONNX fp32 (rows of logits)"
    )
    fp16_min_cosine: float = Field(
        0.999, ge=-1, le=1, description="embeddings: the least cosine of an fp16 vector to ONNX fp32's (per text)"
    )

    newer_defaults: ClassVar[dict[str, Any]] = {"fp16_max_drop": 0.5, "fp16_min_agreement": 0.99,
                                                "fp16_min_cosine": 0.999}  # fmt: skip


class ExportSettings(FrozenModel):
    """How the int8 graph is made (both graphs of a run, the artifact's and the dense teacher's, alike).

    Attributes:
        int8: `dynamic` (activation scales computed per call: a sentence's scores can depend on what it is batched
            with) or `static` (QDQ, scales calibrated once on train sentences: batch-invariant).
        calibration: train sentences (the first N of the training split) static calibration runs on.
    """

    int8: Literal["dynamic", "static"] = "dynamic"
    calibration: int = Field(256, ge=1)


class TargetConfig(KeyStableModel):
    """A speed target (`--target-speedup X`): the artifact's int8 graph X times faster than the dense fp32 teacher.

    Attributes:
        speedup: the target ratio (None: no target; the recipe's own sparsity applies).
        batch, seq: the input shape the target is stated at (the benchmark's headline).
        headroom: the window above the target the measured speed may land in: the plan aims at its middle, and a
            timing check outside the window's middle half moves the shape (`checks`). Measured speed spreads about
            2-3% run to run on a quiet 2-core machine; the table's prediction was 4-6% off on some machines, which
            the checks remove.
        checks: before any training, the planned shape's int8 graph (the teacher's weights cut to it) is exported
            and timed against the dense fp32 teacher, at most this many times: a check outside the window re-plans
            with the error it measured (`pipeline.compress.shapes.calibrate`). Cached per shape and machine, as the
            table is. 0: trust the table.
        layers: depths the search may choose when the chain starts with distill (None: 1 to the teacher's).
        min_depth: the smallest fraction of the teacher's layers such a student keeps (the search's depths start at
            ceil(min_depth x layers)). 0 for sentence tasks; the token-classification kind sets 0.66 (4 of 6): on
            CoNLL-2003 the MiniLM teacher's 3-layer students lost 3.2 to 3.4 F1 before any pruning where 4-layer
            ones gained 0.4 to 0.5 (docs/results.md).
        min_heads: heads every layer keeps at least. Keeping the most weights (`objective: weights`), where a head's
            weights cost about what FFN neurons' do, the search keeps one head a layer on a tight budget: a 12 x 768
            MPNet planned at 10x as 6 layers of 1 head lost 5.8 points more on SST-2's full sentences (dev) than on
            the phrases it was validated on, against 2.6 for the 6-layer student before pruning; the MiniLM
            teacher's 8x plan, 2 layers of 1 head and 1,152 neurons, lost 3.6 dev points more than 2 of 4 heads and
            768 at equal speed.
            A floor alone can make the search drop a layer instead (3 heads: 1 layer of 12, 2.4 points worse).
        objective: which of the shapes that meet the target the search keeps: `balanced` the one with the largest
            smallest fraction kept of the teacher's layers, heads, FFN neurons and hidden size (then the deepest, then
            the most weights); `weights` the most encoder weights (the first search: one head a layer on tight
            budgets, 3.6 dev points worse at 8x on SST-2, docs/decisions.md); `widths` the largest smallest
            fraction of heads, FFN neurons and hidden size alone, then the deepest: it sheds layers, down to
            `min_depth`, before it masks (the `embedding` recipe's: at 4x on STS-B its 3 x 12 x 1504 ended 0.80
            Spearman under the teacher on validation where the balanced 4 x 6 x 864 ended 2.41 under).
        hidden: narrower hidden sizes the search may choose besides the teacher's (multiples of its head size),
            for a chain that cuts its student from the teacher (distill first): a latency table is measured at
            each, and the student is cut at the chosen one (`config.student.hidden`). None: the teacher's only.
        heads_grid, ffn_grid: fractions of the teacher's heads and FFN width the latency table measures.
        busy_attempts: measurements of the latency table tried before giving up on a busy machine.
        busy_wait_s: between two attempts, wait up to this long for the machine to become quiet.
        accept_busy: plan on a table measured on a busy machine (after every attempt); it is recorded as busy in
            the plan and never cached. Off: a busy machine stops the run in one line, with nothing cached.
    """

    speedup: float | None = Field(None, gt=1)
    batch: BatchSize = 8
    seq: int = Field(128, ge=8)
    headroom: float = Field(0.05, ge=0, le=0.5)
    layers: tuple[Depth, ...] | None = Field(None, min_length=1)
    min_depth: float = Field(0.0, ge=0, le=1)
    min_heads: int = Field(1, ge=1)
    objective: Literal["balanced", "weights", "widths"] = "balanced"
    hidden: tuple[Annotated[int, Field(ge=1)], ...] | None = Field(None, min_length=1)
    heads_grid: tuple[Fraction, ...] = Field((1 / 12, 1 / 6, 1 / 3, 1 / 2, 2 / 3, 1.0), min_length=1)
    ffn_grid: tuple[Fraction, ...] = Field((1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0), min_length=1)
    busy_attempts: int = Field(3, ge=1, le=10)
    busy_wait_s: float = Field(60.0, ge=0, le=3600)
    accept_busy: bool = False
    checks: int = Field(3, ge=0, le=8)

    newer_defaults: ClassVar[dict[str, Any]] = {"checks": 3}  # the configs' JSON (artifact names) stay


class CustomTask(BaseModel):
    """A user's task, as its YAML file declares it (`--task-file`); train and dev are absolute once loaded.

    ```yaml
    name: intents
    kind: sequence-classification  # the default; or token-classification, question-answering
    train: data/train.jsonl        # .tsv, .csv or .jsonl (format from the extension), relative to this file
    dev: data/dev.jsonl
    text_columns: [premise, hypothesis]   # one column, or two for a pair task
    label_column: label
    labels: [entailment, neutral, contradiction]   # in id order; string or integer values as in the files
    metric: accuracy               # accuracy | f1 (two labels) | macro_f1
    ```

    Token classification (NER): `train`/`dev` in CoNLL format (`.txt`, `.conll`: word first, tag last, a blank
    line between sentences) or JSONL (`.jsonl`: a list of words in `text_columns[0]`, default `tokens`, and as
    many tags in `label_column`, default `tags`); `labels` is the tag set in id order (`O`, and `B-X` and `I-X`
    for each entity type X); `scheme` IOB2 (the default) or IOB1, both read by the CoNLL rules and kept as IOB2;
    the metric is entity-level f1. Question answering: `train`/`dev` in SQuAD JSON (`.json`) or JSONL (`.jsonl`:
    id, question, context, answers), no labels; the metric is SQuAD's f1 (exact match reported beside it).
    Sentence embeddings (`kind: sentence-embedding`), no labels: scored pairs (TSV, CSV or JSONL; two
    `text_columns`, default sentence1 and sentence2, and the score in `label_column`, default score; metric
    spearman, the default, or pearson) or retrieval (metric ndcg_at_10, recall_at_1 or recall_at_10; SQuAD JSON,
    or JSONL lines of `query`, its relevant `document` and an optional `group`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: str = SEQUENCE  # one of `pipeline.kinds.KIND_NAMES`
    train: str
    dev: str
    text_columns: tuple[str, ...] = ()
    label_column: str = ""
    labels: tuple[str | int, ...] = ()
    # each kind takes its own (`Kind.check_task_file`)
    metric: Literal[
        "accuracy", "f1", "macro_f1", "spearman", "pearson", "ndcg_at_10", "recall_at_1", "recall_at_10"
    ] = "accuracy"  # fmt: skip
    scheme: Literal["IOB1", "IOB2"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data):
        if isinstance(data, dict) and data.get("kind") in BY_NAME:
            data = {**BY_NAME[data["kind"]].task_file_defaults, **data}
        return data

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v):
        if v not in BY_NAME:
            raise ValueError(f"unknown task kind {v!r}; one of {', '.join(KIND_NAMES)}")
        return v

    @field_validator("text_columns", mode="before")
    @classmethod
    def _one_or_two(cls, v):
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list | tuple) or not 1 <= len(v) <= 2 or not all(isinstance(c, str) and c for c in v):
            raise ValueError("give one text column, or two for a pair task")
        if len(v) == 2 and v[0] == v[1]:
            raise ValueError(f"a pair task needs two different columns, not {v[0]!r} twice")
        return v

    @model_validator(mode="after")
    def _per_kind(self) -> CustomTask:
        kind = BY_NAME[self.kind]
        for key in ("train", "dev"):
            path = getattr(self, key)
            if Path(path).suffix.lower() not in kind.formats:
                formats = ", ".join(kind.formats)
                raise ValueError(f"{key}: {path!r}: the format comes from the extension, one of {formats}")
        kind.check_task_file(self)
        return self


def parse(cls: type[BaseModel], data: Any, what: str) -> Any:
    """`cls.model_validate(data)`, with the first validation error as a one-line PipelineError about `what`."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise PipelineError(f"invalid {what}: {loc + ': ' if loc else ''}{msg}") from None
