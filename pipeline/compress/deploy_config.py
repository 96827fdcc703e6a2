"""The deploy configuration: everything one run needs, with its method chain as a typed value.

`DeployConfig.chain` holds one validated config object per method of the chain (`DistillConfig`, `SmpConfig`,
...), built once when the configuration is read; every stage reads them from it. Its serialised form is what it
was when the chain was a string and a dict of sections (`method: distill+smp`, `config: {distill: ..., smp: ...}`),
byte for byte, so artifact names and cache keys do not move, and state files and Prefect parameters read back.
"""

from __future__ import annotations

from typing import Any

from pydantic import SerializeAsAny, SerializerFunctionWrapHandler, model_serializer, model_validator

from pipeline.compress.registry import Method, get_method, parse_chain
from pipeline.config.recipes import CHAIN_SEP
from pipeline.config.schema import (
    BenchSettings,
    CustomTask,
    DataLimits,
    ExportSettings,
    FrozenModel,
    Gates,
    MethodConfig,
    TargetConfig,
    TrainConfig,
    parse,
)
from pipeline.errors import PipelineError


class DeployConfig(FrozenModel):
    """Everything one deploy run needs, after recipe + CLI overrides.

    Read from a mapping with `method` (a chain such as `distill+smp`) and `config` (one section per method,
    `config.<method>`, each validated by the method's own config class); `teacher` comes from the shared teacher
    definitions in `recipes/teacher/` unless a recipe inlines one.
    """

    task: str
    custom_task: CustomTask | None = None  # a user's task (`--task-file`); it travels with the artifact's config
    chain: tuple[SerializeAsAny[MethodConfig], ...]
    teacher: TrainConfig
    data: DataLimits = DataLimits()
    bench: BenchSettings = BenchSettings()
    gates: Gates = Gates()
    target: TargetConfig = TargetConfig()
    export: ExportSettings = ExportSettings()

    @model_validator(mode="before")
    @classmethod
    def _chain_from_sections(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "chain" in data:
            return data
        data = dict(data)
        name = data.pop("method", None)
        if not isinstance(name, str):
            raise PipelineError("invalid recipe: method: give the method or chain as a string, e.g. distill+smp")
        sections = data.pop("config", None) or {}
        if not isinstance(sections, dict):
            raise PipelineError(f"invalid {name} config: give a mapping of settings, not {type(sections).__name__}")
        methods = parse_chain(name)
        unknown = sorted(set(sections) - {m.name for m in methods})
        if unknown:
            raise PipelineError(
                f"invalid {name} config: unknown section(s) {', '.join(unknown)}; the config has one section "
                f"per method of the chain ({', '.join(m.name for m in methods)})"
            )
        data["chain"] = tuple(parse(m.config_cls, sections.get(m.name) or {}, f"{m.name} config") for m in methods)
        return data

    @model_serializer(mode="wrap")
    def _as_sections(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if "chain" not in data:  # dumped with include= or exclude= leaving it out
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "chain":  # where the string and the sections stood, in their order
                out["method"] = self.method
                out["config"] = self.sections
            else:
                out[key] = value
        return out

    @property
    def method(self) -> str:
        """The chain's name as the CLI writes it: `smp`, `distill+smp`."""
        return CHAIN_SEP.join(cfg.name for cfg in self.chain)

    @property
    def sections(self) -> dict[str, dict[str, Any]]:
        """Each method's config by name, as plain JSON data with every default filled in (what ran is recorded)."""
        return {cfg.name: cfg.model_dump(mode="json") for cfg in self.chain}

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
        parse_chain(CHAIN_SEP.join(cfg.name for cfg in chain))
        return self.model_copy(update={"chain": chain})
