"""Prometheus metrics, in a registry of their own (several apps in one process do not collide)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving.batcher import BatchStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

disable_created_metrics()  # the *_created series only add noise to every scrape


class Metrics:
    """Request counts, latencies and errors per endpoint; texts and requests per model call; queue depth.

    Args:
        model: the served model's name and precision, exported once as `serving_model_info`.
        queue_depth: read at scrape time.
    """

    def __init__(self, model: str, precision: str, queue_depth: Callable[[], int]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "serving_requests", "HTTP requests by endpoint and status code.", ["endpoint", "code"], registry=r
        )
        self.latency = Histogram(
            "serving_request_duration_seconds",
            "Time from request to response, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "serving_errors",
            "Requests answered with an error, by endpoint and reason.",
            ["endpoint", "reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            "serving_batch_size", "Texts per ONNX Runtime call.", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "serving_batch_requests", "Requests per ONNX Runtime call.", buckets=BATCH_BUCKETS, registry=r
        )
        self.inference = Histogram(
            "serving_inference_duration_seconds",
            "Seconds per ONNX Runtime call (tokenisation is not included: see serving_tokenization_duration_seconds).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenization = Histogram(
            "serving_tokenization_duration_seconds",
            "Seconds per request to tokenise its texts, waiting for a tokeniser thread included.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "serving_queue_wait_seconds",
            "Seconds the oldest request of a batch waited before its model call.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        depth = Gauge("serving_queue_depth", "Requests waiting for the model.", registry=r)
        depth.set_function(queue_depth)
        info = Gauge("serving_model_info", "The served model.", ["model", "precision"], registry=r)
        info.labels(model, precision).set(1)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

    def observe_request(self, endpoint: str, code: int, seconds: float, reason: str | None = None) -> None:
        self.requests.labels(endpoint, str(code)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if reason is not None:
            self.errors.labels(endpoint, reason).inc()

    def observe_tokenization(self, seconds: float) -> None:
        self.tokenization.observe(seconds)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.texts)
        self.batch_requests.observe(stats.requests)
        self.inference.observe(stats.seconds)
        self.queue_wait.observe(stats.waited)

    def render(self) -> bytes:
        return generate_latest(self.registry)
