"""Shared by the serving tests: a real tiny artifact (built once per session), and servers on loopback ports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from pipeline.data import SAMPLE_DIR

LABELS = {0: "negative", 1: "positive"}


def dev_sentences() -> list[str]:
    """The shipped SST-2 dev sample (250 sentences)."""
    lines = (SAMPLE_DIR / "sst2_sample" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def tiny_artifact(base: Path) -> Path:
    """A published artifact of a tiny random BERT classifier (fp32 + int8 graphs, tokenizer, manifest), built
    with the project's own export and packaging functions; reused when `base` already holds it."""
    final = base / "sst2-tiny-serving"
    if (final / "manifest.json").is_file():
        return final
    from export.onnx import export_optimized
    from export.package import new_staging, publish
    from pipeline.testing import tiny_model, tiny_tokenizer

    model = tiny_model("bert")
    model.config.id2label, model.config.label2id = LABELS, {v: k for k, v in LABELS.items()}
    staging = new_staging(base, final.name)
    export_optimized(model, tiny_tokenizer("bert"), staging)
    report = {"task": "sst2", "method": "none", "data": {"source": "test"},
              "teacher": {"source": "tiny", "path": None}}
    return publish(staging, report, inputs={}, config={})


class ServerProcess:
    """`python -m serving ARTIFACT --port 0 ...` in a subprocess; stderr goes to a file the port is read from."""

    def __init__(self, artifact: Path, *args: str, log: Path, env: dict | None = None) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "serving", str(artifact), "--port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=self._log_file, env={**os.environ, **(env or {})},
        )
        self.url = None

    def wait_started(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", self.log.read_text())
            if found:
                self.url = found.group(1)
                return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()}")
            time.sleep(0.1)
        raise TimeoutError(f"server did not start: {self.log.read_text()}")

    def wait_exit(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._log_file.close()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


class ThreadServer:
    """An ASGI app on a loopback port, served by uvicorn in a thread of the test process (fast to start, and
    `stop()` takes the same path as SIGTERM: uvicorn's `should_exit`)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = None

    def _run(self) -> None:
        from serving.server import bind

        sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server.run(sockets=[sock])

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("in-process server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True

    def __exit__(self, *exc) -> None:
        self.stop()
        self.thread.join(60)


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def metric_samples(client: httpx.Client, url: str, **headers) -> dict[tuple, float]:
    """`/metrics` as {(sample name, sorted labels...): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get(f"{url}/metrics", headers=headers).raise_for_status().text
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }
