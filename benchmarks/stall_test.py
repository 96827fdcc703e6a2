"""Stall test of the serving HTTP server: a one-text request's latency while large requests keep it busy.

Starts `python -m serving ARTIFACT` on a free loopback port and measures the p50 latency of a one-text POST
/predict (`--probes` requests, one at a time) twice: on the idle server, then while `--clients` connections keep
sending requests of `--items` texts of `--chars` characters each (the server's default limits: 64 × 10,000;
prose from the shipped SST-2 sample, a pair of such texts per item for a sentence-pair artifact). For a
question-answering artifact each item is a question with a context of `--chars` characters, at `top_k` at its bound
(`serving.spans.MAX_TOP_K`), and the probe is one question on a short context; at the server's default
`--max-windows` such a flood is refused (413) once a request passes the cap, and `--max-windows 0` starts the
server with a cap that takes it whole, the worst case it could be configured for. Large requests refused with a 413
or 503 are counted apart (the server shedding load as it should). A second connection probes
`GET /v2/health/live` meanwhile. Prints both p50s and their ratio and the health probe's latencies, and exits 1
when the ratio exceeds `--max-ratio` (5), the slowest health answer `--max-health-ms` (100), or any other request
failed.

    python benchmarks/stall_test.py ARTIFACT [--precision int8] [--threads 2] [--json out.json]

The client is `load_test.py`'s minimal asyncio HTTP/1.1 client, in one process with the request bodies built
beforehand, so that it takes as little CPU as possible from the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import DEFAULT_TEXTS, Connection, _run, artifact_columns, artifact_task, body_of, launch_server

from serving.artifact import QA, task_kind  # load_test put the project on the path
from serving.spans import MAX_TOP_K

PROBE = "a warm , funny film"
QUESTION = "what is the film about?"


def large_body(items: int, chars: int, pair: bool, kind: str) -> bytes:
    """One request of `items` texts (or pairs, or questions on contexts) of exactly `chars` characters of prose,
    each starting elsewhere."""
    lines = DEFAULT_TEXTS.read_text(encoding="utf-8").splitlines()[1:]
    prose = " ".join(line.split("\t")[0] for line in lines)
    prose = prose * (chars // len(prose) + 2)

    def text(i: int) -> str:
        start = (i * 997) % (len(prose) - chars)
        return prose[start : start + chars]

    if kind == QA:
        questions = [{"question": QUESTION, "context": text(i)} for i in range(items)]
        return json.dumps({"inputs": questions, "parameters": {"top_k": MAX_TOP_K}}).encode()
    inputs = [{"text": text(2 * i), "text_pair": text(2 * i + 1)} if pair else text(i) for i in range(items)]
    return json.dumps({"inputs": inputs}).encode()


def small_body(pair: bool, kind: str) -> bytes:
    if kind == QA:
        return json.dumps({"inputs": {"question": QUESTION, "context": PROBE}}).encode()
    return body_of((PROBE, PROBE) if pair else PROBE)


def start_server(args: argparse.Namespace, body_bytes: int, log: Path) -> tuple[subprocess.Popen, str]:
    """`python -m serving` on a free loopback port, taking bodies of `body_bytes`; returns the process and its URL
    once it listens."""
    options = ["--precision", args.precision, "--max-batch", str(args.max_batch),
               "--max-wait-ms", str(args.max_wait_ms), "--max-batch-tokens", str(args.max_batch_tokens),
               "--max-items", str(args.items),
               "--max-text-chars", str(args.chars), "--max-body-bytes", str(max(1 << 20, body_bytes)),
               "--max-windows", str(args.max_windows or args.items * args.chars)]  # fmt: skip
    return launch_server(args.artifact, options, args.threads, log)


async def probe(conn: Connection, body: bytes, n: int, duration: float) -> tuple[list[float], int]:
    """Latencies (s) of up to `n` one-text requests sent one after the other (for at most `duration` s), and how
    many of them failed."""
    latencies, errors = [], 0
    deadline = time.perf_counter() + duration
    while len(latencies) < n and time.perf_counter() < deadline:
        start = time.perf_counter()
        status, _ = await conn.request("POST", "/predict", body)
        latencies.append(time.perf_counter() - start)
        errors += status != 200
    return latencies, errors


async def probe_health(conn: Connection, stop: asyncio.Event, out: list[float]) -> None:
    """GET /v2/health/live every 20 ms until `stop` is set, recording each latency (s)."""
    try:
        while not stop.is_set():
            start = time.perf_counter()
            status, _ = await conn.request("GET", "/v2/health/live", b"")
            out.append(time.perf_counter() - start if status == 200 else float("inf"))
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


async def keep_sending(conn: Connection, body: bytes, stop: asyncio.Event, out: dict) -> None:
    """Send `body` again as soon as each answer comes, until `stop` is set; counts answers and failures."""
    try:
        while not stop.is_set():
            status, _ = await conn.request("POST", "/predict", body)
            out["requests"] += 1
            out["served"] += status == 200
            out["refused"] += status in (413, 503)
            out["errors"] += status not in (200, 413, 503)
    finally:
        await conn.close()


async def measure(url: str, args: argparse.Namespace, large: bytes) -> dict:
    parts = urlsplit(url)
    small = small_body(args.pair, args.kind)
    conn = Connection(parts.hostname, parts.port, {})
    try:
        await probe(conn, small, 10, 30)  # warm-up, not counted
        idle, idle_errors = await probe(conn, small, args.probes, args.duration)
        stop, large_stats = asyncio.Event(), {"requests": 0, "served": 0, "refused": 0, "errors": 0}
        senders = [
            asyncio.create_task(keep_sending(Connection(parts.hostname, parts.port, {}), large, stop, large_stats))
            for _ in range(args.clients)
        ]
        await asyncio.sleep(args.ramp)  # every client has a large request in flight or queued
        health: list[float] = []
        prober = asyncio.create_task(probe_health(Connection(parts.hostname, parts.port, {}), stop, health))
        start, answered = time.perf_counter(), large_stats["served"]
        loaded, loaded_errors = await probe(conn, small, args.probes, args.duration)
        seconds, answered = time.perf_counter() - start, large_stats["served"] - answered
        stop.set()
        await asyncio.gather(*senders, prober)
    finally:
        await conn.close()
    return {
        "idle_p50_ms": float(np.median(idle) * 1000),
        "loaded_p50_ms": float(np.median(loaded) * 1000),
        "loaded_p99_ms": float(np.percentile(loaded, 99) * 1000),
        "probes": {"idle": len(idle), "loaded": len(loaded)},
        "probe_errors": idle_errors + loaded_errors,
        "large_requests": large_stats["requests"],
        "large_errors": large_stats["errors"],
        "large_refused": large_stats["refused"],
        "large_texts_per_s": answered * args.items / seconds,  # served while the one-text requests were measured
        "health_p50_ms": float(np.median(health) * 1000),
        "health_max_ms": float(np.max(health) * 1000),
        "health_probes": len(health),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path, help="artifact folder to serve")
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: available cores)")
    p.add_argument("--max-batch", type=int, default=32, help="the server's max batch (%(default)s)")
    p.add_argument(
        "--max-batch-tokens", type=int, default=256, help="the server's token budget per call (%(default)s)"
    )
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's max wait (%(default)s)")
    p.add_argument("--clients", type=int, default=10, help="connections sending large requests (%(default)s)")
    p.add_argument("--items", type=int, default=64, help="texts per large request (%(default)s)")
    p.add_argument("--chars", type=int, default=10_000, help="characters per large text (%(default)s)")
    p.add_argument("--probes", type=int, default=50, help="one-text requests per phase (%(default)s)")
    p.add_argument("--duration", type=float, default=120, help="most seconds per phase (%(default)s)")
    p.add_argument("--ramp", type=float, default=2.0, help="seconds of large load before probing (%(default)s)")
    p.add_argument("--max-ratio", type=float, default=5.0, help="fail above this loaded/idle p50 (%(default)s)")
    p.add_argument(
        "--max-health-ms", type=float, default=100.0, help="fail above this slowest health answer (%(default)s ms)"
    )
    p.add_argument(
        "--max-windows",
        type=int,
        default=256,
        help="the server's windows per request (%(default)s, its default; 0: enough for the whole flood)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 256 or min(args.items, args.chars, args.probes) < 1:
        p.error("--clients must be 1..256; --items, --chars and --probes at least 1")
    task = artifact_task(args.artifact)
    args.kind = task_kind(task)
    args.pair = args.kind != QA and len(artifact_columns(args.artifact, task)) == 2
    large = large_body(args.items, args.chars, args.pair, args.kind)
    log = Path(tempfile.mkstemp(prefix="stall-test-server-", suffix=".log")[1])
    proc, url = start_server(args, len(large), log)  # 64 pairs of 10,000 characters are over the default 1 MiB
    try:
        result = _run(measure(url, args, large))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        log.unlink(missing_ok=True)
    result["ratio"] = result["loaded_p50_ms"] / result["idle_p50_ms"]
    print(f"idle: one-text p50 {result['idle_p50_ms']:.1f} ms over {result['probes']['idle']} requests")
    print(
        f"with {args.clients} clients sending {args.items} x {args.chars:,}-character requests: one-text p50 "
        f"{result['loaded_p50_ms']:.1f} ms (p99 {result['loaded_p99_ms']:.1f} ms) over {result['probes']['loaded']} "
        f"requests; {result['large_requests']} large requests answered, {result['large_refused']} of them refused, "
        f"{result['large_texts_per_s']:.0f} texts/s served"
    )
    print(
        f"health under load: p50 {result['health_p50_ms']:.1f} ms, slowest {result['health_max_ms']:.1f} ms over "
        f"{result['health_probes']} probes (at most {args.max_health_ms:g})"
    )
    failed = result["probe_errors"] + result["large_errors"]
    print(f"ratio loaded/idle p50: {result['ratio']:.2f} (at most {args.max_ratio:g}); failed requests: {failed}")
    if args.json:
        out = {**result, "kind": args.kind, "precision": args.precision, "threads": args.threads}
        args.json.write_text(json.dumps(out, indent=2))
    slow = result["ratio"] > args.max_ratio or result["health_max_ms"] > args.max_health_ms
    return 1 if failed or slow else 0


if __name__ == "__main__":
    sys.exit(main())
