"""The export stage: fused fp32, int8 and (for CUDA) fp16 ONNX graphs of the compacted model (the artifact's), and
the dense teacher's fp32 and int8 (the benchmark's baseline, exported once per teacher and cached)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from export.onnx import export_optimized
from pipeline.cache import read_report
from pipeline.config.schema import ExportSettings
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.kinds import kind_of
from pipeline.models.dense_graphs import dense_graphs
from pipeline.models.families import family_of
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.staging import DENSE_GRAPHS, WORK, stamp_task
from serving.artifact import CONFIG, PYTORCH

log = logging.getLogger(__name__)


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
    model = load_model(compact_dir)
    family = family_of(model)
    report = {
        "compressed": export_optimized(
            model, tokenizer, staging_path, calibration=calibration, fusion=family.ort_fusion, fp16=True
        )
    }
    layout = kind_of(ref.task.kind).write_layout(staging_path, model, max_length)
    if layout:
        report["compressed"]["layout"] = layout
    positions = family.usable_positions(json.loads((staging_path / CONFIG).read_text()))
    # what the server reads: the length it serves at, and the longest its position embeddings take
    stamp_task(staging_path, {**ref.task.describe(), "max_length": max_length, "positions": positions})
    entry, hit = dense_graphs(teacher_dir, cache_dir, calibration)
    for name in DENSE_GRAPHS.values():
        shutil.copy2(entry / name, staging_path / WORK / name)  # a copy: the run never touches the cache entry
    report["dense"] = {**read_report(entry), "cached": hit}
    baselines = kind_of(ref.task.kind).baseline_graphs(teacher_dir, staging_path / WORK, cache_dir)
    if baselines:
        report["baselines"] = baselines
    log.info("dense teacher ONNX: %s (%s)", entry, "cached" if hit else "exported now")
    return report
