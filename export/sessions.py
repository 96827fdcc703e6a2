"""ONNX Runtime sessions for every in-process use outside the server: benchmark timing and parity checks.

(`serving/` builds its own, to stay importable without this package in the slim image.)
"""

from __future__ import annotations

import os

import onnxruntime as ort

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def make_session(path, provider: str = CPU, threads: int | None = None) -> ort.InferenceSession:
    """Create a session with the benchmark's fixed settings.

    Spinning is off because idle sessions kept alive in the same process otherwise
    busy-wait and steal cores from the one being timed.

    Args:
        path: ONNX file.
        provider: Execution provider; CPU is always appended as fallback.
        threads: intra-op threads; None means physical cores.
    """
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or physical_cores()
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = [provider] if provider == CPU else [provider, CPU]
    return ort.InferenceSession(str(path), sess_options=so, providers=providers)
