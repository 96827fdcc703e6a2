"""The export stage: fused fp32 and int8 ONNX graphs of the compacted model (the artifact's), and of the dense
teacher (the benchmark's baseline, exported once per teacher and cached)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from importlib import metadata
from pathlib import Path

from export.onnx import EXPORT_LIBRARIES, OPSET, export_optimized
from pipeline.cache import cached_build, dir_digest, key_of
from pipeline.config.schema import ExportSettings
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.stages.package import DENSE_GRAPHS, DENSE_STEM, WORK, stamp_task
from serving.artifact import PYTORCH

log = logging.getLogger(__name__)

DENSE_EXPORT_VERSION = "1"  # bump when the export, fusion or quantisation of the dense graphs changes


def dense_graphs(teacher_dir: str, cache_dir: str, calibration: list[dict] | None = None) -> tuple[Path, bool]:
    """The dense teacher's `dense.onnx` and `dense.int8.onnx` (static int8 when `calibration` is given), cached by
    the teacher's digest, the calibration examples and the exporting libraries' versions: every deploy from one
    teacher, and the latency table, use the same graphs, exported once. Returns (cache entry, hit)."""
    key = key_of(
        stage="dense-onnx",
        v=DENSE_EXPORT_VERSION,
        teacher=dir_digest(Path(teacher_dir)),
        opset=OPSET,
        versions={d: metadata.version(d) for d in EXPORT_LIBRARIES},
        int8=None if calibration is None else hashlib.sha256(json.dumps(calibration).encode()).hexdigest(),
    )

    def build(out: Path) -> None:
        stats = export_optimized(load_model(teacher_dir), None, out, stem=DENSE_STEM, calibration=calibration)
        (out / "export.json").write_text(json.dumps(stats))

    return cached_build(Path(cache_dir), "dense_onnx", key, build)


def run(
    staging: str, teacher_dir: str, cache_dir: str, ref: DataRef, settings: ExportSettings, max_length: int
) -> dict:
    """Export the compacted model (artifact root) and the dense teacher (work folder, for the benchmark).

    Static int8 (`settings.int8`) calibrates both graphs on the same first `settings.calibration` train examples
    of `ref`, tokenised at `max_length`.
    """
    staging_path = Path(staging)
    compact_dir = staging_path / PYTORCH
    tokenizer = load_tokenizer(compact_dir)
    calibration = None
    if settings.int8 == "static":
        calibration = encode(tokenizer, ref.load().train.head(settings.calibration), max_length).features
    report = {
        "compressed": export_optimized(load_model(compact_dir), tokenizer, staging_path, calibration=calibration)
    }
    stamp_task(staging_path, ref.task.describe())
    entry, hit = dense_graphs(teacher_dir, cache_dir, calibration)
    for name in DENSE_GRAPHS.values():
        shutil.copy2(entry / name, staging_path / WORK / name)  # a copy: the run never touches the cache entry
    report["dense"] = {**json.loads((entry / "export.json").read_text()), "cached": hit}
    log.info("dense teacher ONNX: %s (%s)", entry, "cached" if hit else "exported now")
    return report
