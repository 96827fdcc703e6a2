"""The dense teacher's fused fp32 and int8 ONNX graphs: the baseline every speed figure is a ratio to, exported once
per teacher and cached (the plan stage times them in the latency table, the export stage copies them into the
staging folder's work part for the benchmark)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from export.onnx import OPSET, export_optimized, library_versions
from pipeline.cache import cached_stage, dir_digest
from pipeline.models.families import family_of
from pipeline.models.io import load_model
from pipeline.staging import DENSE_STEM

# bump when the dense export, fusion, int8 or entry layout changes (2: the stage report; 3: 7-bit int8 weights)
DENSE_EXPORT_VERSION = "3"


def dense_graphs(teacher_dir: str, cache_dir: str, calibration: list[dict] | None = None) -> tuple[Path, bool]:
    """The dense teacher's `dense.onnx` and `dense.int8.onnx` (static int8 when `calibration` is given), cached by
    the teacher's digest, the calibration examples and the exporting libraries' versions: every deploy from one
    teacher, and the latency table, use the same graphs, exported once. Returns (cache entry, hit)."""

    def build(out: Path) -> dict:
        teacher = load_model(teacher_dir)
        fusion = family_of(teacher).ort_fusion
        return export_optimized(teacher, None, out, stem=DENSE_STEM, calibration=calibration, fusion=fusion)

    int8 = None if calibration is None else hashlib.sha256(json.dumps(calibration).encode()).hexdigest()
    key = dict(stage="dense-onnx", v=DENSE_EXPORT_VERSION, teacher=dir_digest(Path(teacher_dir)), opset=OPSET,
               versions=library_versions(), int8=int8)  # fmt: skip
    entry, hit, _ = cached_stage(cache_dir, "dense_onnx", key, build)
    return entry, hit
