"""The export stage: fused fp32 and int8 ONNX graphs of the compacted model (the artifact's), and of the dense
teacher (the benchmark's baseline, exported once per teacher and cached)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from export.onnx import OPSET, export_optimized, library_versions
from pipeline.cache import cached_build, dir_digest, key_of, read_report, write_report
from pipeline.config.schema import ExportSettings
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.stages.package import WORK, stamp_task
from serving.artifact import PYTORCH

log = logging.getLogger(__name__)

DENSE_STEM = "dense"
DENSE_GRAPHS = {"fp32": f"{DENSE_STEM}.onnx", "int8": f"{DENSE_STEM}.int8.onnx"}  # in the work folder, for bench
# bump when the dense export, fusion, int8 or entry layout changes (2: the stage report; 3: 7-bit int8 weights)
DENSE_EXPORT_VERSION = "3"


def dense_graphs(teacher_dir: str, cache_dir: str, calibration: list[dict] | None = None) -> tuple[Path, bool]:
    """The dense teacher's `dense.onnx` and `dense.int8.onnx` (static int8 when `calibration` is given), cached by
    the teacher's digest, the calibration examples and the exporting libraries' versions: every deploy from one
    teacher, and the latency table, use the same graphs, exported once. Returns (cache entry, hit)."""
    key = key_of(
        stage="dense-onnx",
        v=DENSE_EXPORT_VERSION,
        teacher=dir_digest(Path(teacher_dir)),
        opset=OPSET,
        versions=library_versions(),
        int8=None if calibration is None else hashlib.sha256(json.dumps(calibration).encode()).hexdigest(),
    )

    def build(out: Path) -> None:
        stats = export_optimized(load_model(teacher_dir), None, out, stem=DENSE_STEM, calibration=calibration)
        write_report(out, stats)

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
    stamp_task(staging_path, {**ref.task.describe(), "max_length": max_length})  # what the server reads at
    entry, hit = dense_graphs(teacher_dir, cache_dir, calibration)
    for name in DENSE_GRAPHS.values():
        shutil.copy2(entry / name, staging_path / WORK / name)  # a copy: the run never touches the cache entry
    report["dense"] = {**read_report(entry), "cached": hit}
    log.info("dense teacher ONNX: %s (%s)", entry, "cached" if hit else "exported now")
    return report
