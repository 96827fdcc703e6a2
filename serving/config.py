"""Server settings: one frozen dataclass (no pydantic, to keep the serving image small) and the core count."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from serving.artifact import GRAPHS

API_KEY_ENV = "SERVING_API_KEY"
PRECISIONS = tuple(GRAPHS)  # fp32, int8, fp16
DEVICES = ("cpu", "cuda")


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 quota (`docker run --cpus`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclass(frozen=True)
class ServerConfig:
    """Everything `python -m serving` and `pipeline serve` accept.

    Attributes:
        artifact: the artifact folder (checked against its manifest.json at start-up).
        host: address to bind; loopback unless told otherwise.
        port: TCP port (0: any free port, printed at start-up).
        precision: "fp32" (model.onnx), "int8" (model.int8.onnx) or "fp16" (model.fp16.onnx, for CUDA).
        device: "cpu", or "cuda": ONNX Runtime's CUDA provider (onnxruntime-gpu), inputs and outputs bound with
            IOBinding.
        model_name: the name in the Open Inference Protocol URLs; default: the artifact's name.
        api_key: when set, every endpoint except health needs `Authorization: Bearer KEY` or `X-API-Key: KEY`
            ("": none). A key that is blank or starts or ends with whitespace is refused: HTTP strips that from
            header values, so no request could ever match it.
        max_batch: most texts in one ONNX Runtime call.
        max_batch_tokens: most padded tokens in one call (texts times the longest): long texts run a few at a
            time, so a request that arrives during a call waits for a short one (at least one text always runs).
        max_wait_ms: how long the batcher waits for more requests once one arrived and the batch is not full.
        max_queue: most requests being tokenised or waiting for the model (beyond the batch being computed), and
            at most `max_queue` x `max_batch` texts or question-answering windows among them; more get a 503.
        threads: ONNX Runtime intra-op threads; default: the cores available to the process.
        max_body_bytes: larger request bodies get a 413; at most 1 MiB past the limit is read (and dropped) first.
        max_items: most texts in one request.
        max_text_chars: longest text in characters; longer texts get a 413.
        max_windows: most question-answering windows one request may cut its contexts into (each window is a text
            for the model); more get a 413.
        max_length: tokens per text (a question-answering window); longer tokenised texts are truncated to it,
            keeping the start. None: the length the artifact was trained at (its task block's), else 128.
        graceful_timeout_s: on SIGTERM/SIGINT, how long in-flight requests may take to finish.
        access_log: log one line per request (off by default: it costs throughput).
        trust_key: a public key (PEM): serve the artifact only if its signature (model.sig) verifies with it.
    """

    artifact: Path
    host: str = "127.0.0.1"
    port: int = 8000
    precision: str = "fp32"
    device: str = "cpu"
    model_name: str | None = None
    api_key: str | None = None
    max_batch: int = 32
    max_batch_tokens: int = 256
    max_wait_ms: float = 5.0
    max_queue: int = 256
    threads: int | None = None
    max_body_bytes: int = 1 << 20
    max_items: int = 64
    max_text_chars: int = 10_000
    max_windows: int = 256
    max_length: int | None = None
    graceful_timeout_s: float = 30.0
    access_log: bool = False
    trust_key: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact", Path(self.artifact))
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be {' or '.join(DEVICES)}, not {self.device!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        for name in ("max_batch", "max_batch_tokens", "max_queue", "max_body_bytes", "max_items", "max_text_chars",
                     "max_windows", "max_length"):  # fmt: skip
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        # inf would keep a lone request waiting for a batch that never fills; nan compares false with everything
        for name, value in (("max-wait-ms", self.max_wait_ms), ("graceful-timeout", self.graceful_timeout_s)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number, 0 or more, not {value}")
        if self.trust_key is not None:
            object.__setattr__(self, "trust_key", Path(self.trust_key))
            if not self.trust_key.is_file():
                raise ValueError(f"trust-key {self.trust_key} is not a file")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1, not {self.threads}")
        if self.api_key == "":
            object.__setattr__(self, "api_key", None)
        elif self.api_key is not None and self.api_key != self.api_key.strip():  # " " included
            raise ValueError(
                "api-key must not be blank or start or end with whitespace (HTTP strips it from header values, "
                "so no request could match)"
            )

    @property
    def intra_op_threads(self) -> int:
        return self.threads or available_cores()
