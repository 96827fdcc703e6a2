"""The deploy configuration: everything one run needs, with its method chain as a typed value.

`DeployConfig.chain` holds one validated config object per method of the chain (`DistillConfig`, `SmpConfig`,
...), built once when the configuration is read; every stage reads them from it. Its fields, and so its JSON and
its JSON schema, are what they were when the chain was only a string and a dict of sections (`method: distill+smp`,
`config: {distill: ..., smp: ...}`), byte for byte: artifact names and cache keys do not move, and state files
and Prefect parameters (validated against the schema) read back.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, model_validator

from pipeline.compress.registry import Method, get_method, parse_chain
from pipeline.config.recipes import CHAIN_SEP
from pipeline.config.schema import (
    BenchSettings,
    CustomTask,
    DataLimits,
    ExportSettings,
    Gates,
    KeyStableModel,
    MethodConfig,
    TargetConfig,
    TrainConfig,
    parse,
)
from pipeline.errors import PipelineError


class DeployConfig(KeyStableModel):
    """Everything one deploy run needs, after recipe + CLI overrides.

    `method` names the chain (`smp`, `distill+smp`) and `config` holds one section per method (`config.<method>`);
    reading the config parses each section once into the method's config class (`chain`) and records the section
    with every default filled in (what ran is what is recorded). `teacher` comes from the shared teacher
    definitions in `recipes/teacher/` unless a recipe inlines one.
    """

    task: str
    custom_task: CustomTask | None = None  # a user's task (`--task-file`); it travels with the artifact's config
    method: str
    config: dict[str, Any] = Field(default_factory=dict)
    teacher: TrainConfig
    data: DataLimits = DataLimits()
    bench: BenchSettings = BenchSettings()
    gates: Gates = Gates()
    target: TargetConfig = TargetConfig()
    export: ExportSettings = ExportSettings()
    # the packaged recipe a speed target chose (`Kind.target_recipes`); unsaid if none
    chosen_recipe: str | None = None

    newer_defaults: ClassVar[dict[str, Any]] = {"chosen_recipe": None}
    _chain: tuple[MethodConfig, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _typed_chain(self) -> DeployConfig:
        methods = parse_chain(self.method)
        unknown = sorted(set(self.config) - {m.name for m in methods})
        if unknown:
            raise PipelineError(
                f"invalid {self.method} config: unknown section(s) {', '.join(unknown)}; the config has one section "
                f"per method of the chain ({', '.join(m.name for m in methods)})"
            )
        chain = tuple(parse(m.config_cls, self.config.get(m.name) or {}, f"{m.name} config") for m in methods)
        object.__setattr__(self, "config", _sections(chain))  # still being built: frozen from here on
        self._chain = chain
        return self

    @property
    def chain(self) -> tuple[MethodConfig, ...]:
        """Each method's validated config, in the chain's order."""
        return self._chain

    @property
    def chain_configs(self) -> list[tuple[Method, MethodConfig]]:
        """Each method of the chain with its config."""
        return [(get_method(cfg.name), cfg) for cfg in self.chain]

    @property
    def method_config(self) -> MethodConfig:
        """The config of the method that produces the artifact's model: the chain's last."""
        return self.chain[-1]

    @property
    def model_max_length(self) -> int:
        """Tokens per example the artifact's model was trained at (compaction, export and validation use it too):
        the last training method's `train.max_length`, or the teacher's when nothing trains (`none`)."""
        trained = [cfg for m, cfg in self.chain_configs if m.apply_path is not None]
        return trained[-1].train.max_length if trained else self.teacher.max_length

    @property
    def student_folder(self) -> str | None:
        """The student folder the chain's first stage distils into (`config.student.path`, e.g. a general student),
        whose own shape the plan then prunes; None when the student is cut from the teacher."""
        method, cfg = self.chain_configs[0]
        student = getattr(cfg, "student", None) if method.builds_student else None
        return getattr(student, "path", None)

    @property
    def cuts_student(self) -> bool:
        """The chain starts by cutting a student from the teacher (distill without a student folder): its depth and
        width are the plan's to choose."""
        return get_method(self.chain[0].name).builds_student and self.student_folder is None

    def with_chain(self, chain: tuple[MethodConfig, ...] | list[MethodConfig]) -> DeployConfig:
        """This configuration with another chain (the plan's), checked to be one that can run."""
        chain = tuple(chain)
        method = CHAIN_SEP.join(cfg.name for cfg in chain)
        parse_chain(method)
        planned = self.model_copy(update={"method": method, "config": _sections(chain)})
        planned._chain = chain
        return planned


def _sections(chain: tuple[MethodConfig, ...]) -> dict[str, dict[str, Any]]:
    return {cfg.name: cfg.model_dump(mode="json") for cfg in chain}
