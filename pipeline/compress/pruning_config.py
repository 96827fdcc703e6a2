"""The base of the methods that prune heads and FFN neurons through `pipeline.compress.masking` (smp, gmp)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config.schema import MaskConfig, MethodConfig
from pipeline.models.families import arch_of


class PruningConfig(MethodConfig):
    """Base of the methods that prune heads and FFN neurons through `pipeline.compress.masking` (smp, gmp)."""

    mask: MaskConfig = MaskConfig()

    def preflight(self, model_dir: Path, teacher_dir: Path | None, model_config: dict[str, Any], task: Any) -> None:
        """The mask's blocks must tile the model's matrices."""
        arch = arch_of(model_config)
        self.mask.check_shapes(arch.hidden, arch.ffn)

    def planned(
        self, layers: int, heads: int, ffn: int, teacher: dict[str, int], hidden: int | None = None
    ) -> PruningConfig | None:
        if (heads, ffn) == (teacher["heads"], teacher["ffn"]):
            return None  # every head and neuron stays: nothing to prune
        return self.updated(mask={**self.mask.model_dump(), "shape": {"heads": heads, "ffn": ffn}})
