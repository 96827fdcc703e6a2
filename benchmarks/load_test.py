"""Load test of the serving HTTP server on loopback, against the bare ArtifactSession at the same batch size.

Sends `--requests` one-item POST /predict requests over `--concurrency` keep-alive connections, bounded by
`--duration` seconds; the items, cycled, come from `--texts` in the form the artifact's task kind reads:
- sequence classification: SST-2 dev sentences by default; for a sentence-pair task, `{"text", "text_pair"}`
  objects from the TSV's two text columns, which the artifact's task block names (`../shared/data/mrpc/dev.tsv`);
- token classification: the sentences of a CoNLL-format file (words joined by spaces, as the pipeline trains on
  them), e.g. `--texts ../shared/data/conll2003/dev.txt`;
- question answering: the questions of a SQuAD-format file with their contexts (`../shared/data/squad/dev.json`).
It prints throughput, p50/p99 latency and errors, the mean batch the server formed (from /metrics), then runs the
same items through a bare `ArtifactSession` (same precision, threads and session settings as the server) in
chunks of the server's max batch, and prints the throughput ratio and whether every served answer (top label,
entities, best answer) equals the bare session's. `--pipeline N` also checks the first N distinct served answers
against transformers' pipeline over the artifact (Optimum's ORTModel where optimum-onnx is installed, else the
artifact's torch model for the fp32 graph; transformers 5 has no question-answering pipeline).
The int8 graph quantises each model call's activations with one scale over the whole batch (dynamic
quantisation), so its scores, and now and then an answer, depend on which items were batched together: compare
answers on fp32, or on int8 with `--max-batch 1`.

    # start a server on a free loopback port, measure, stop it
    python benchmarks/load_test.py ARTIFACT --requests 5000 --concurrency 32
    # or target one already running (127.0.0.1 only); the artifact is still needed for the comparison
    python benchmarks/load_test.py ARTIFACT --url http://127.0.0.1:8000 --max-batch 32

The client is a minimal asyncio HTTP/1.1 client, so that on a small machine it takes as little CPU from the
server as possible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from export.releases import optimum_onnx, question_answering_pipeline  # noqa: E402  (ROOT is on the path first)
from serving.artifact import (  # noqa: E402
    CONFIG,
    GRAPHS,
    QA,
    TASK_KEY,
    TOKEN,
    task_kind,
    trained_length,
)

DEFAULT_TEXTS = ROOT / "pipeline" / "data" / "samples" / "sst2" / "dev.tsv"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def load_texts(path: Path, columns: list[str]) -> list[str | tuple[str, str]]:
    """The `columns` of a GLUE-style TSV (one: texts; two: pairs), or for one column a plain file with one text per
    line."""
    lines = [ln for ln in path.read_text(encoding="utf-8-sig").splitlines() if ln.strip()]
    header = lines[0].split("\t")
    if all(c in header for c in columns):
        cols = [header.index(c) for c in columns]
        rows = [ln.split("\t") for ln in lines[1:]]
        return [r[cols[0]] if len(cols) == 1 else (r[cols[0]], r[cols[1]]) for r in rows if len(r) > max(cols)]
    if len(columns) == 2:
        raise SystemExit(f"{path}: the artifact reads pairs from columns {columns}; the header is {header}")
    return lines


def artifact_task(artifact: Path) -> dict:
    """The artifact's task block (empty for artifacts from before it)."""
    return json.loads((artifact / CONFIG).read_text()).get(TASK_KEY) or {}


def artifact_columns(artifact: Path, task: dict | None = None) -> list[str]:
    """The text column(s) the artifact's task block names (`sentence` for artifacts without one)."""
    task = artifact_task(artifact) if task is None else task
    columns = task.get("text_columns") or ["sentence"]
    return columns if task.get("pair") else columns[:1]


def load_items(path: Path, artifact: Path, task: dict) -> list:
    """The items of `path` in the form the artifact's kind reads (see the module's docstring); `task`: its block."""
    kind = task_kind(task)
    if kind == TOKEN:
        from pipeline.kinds.tagged import read_conll

        return [" ".join(words) for words in read_conll(path, task["labels"]).words]
    if kind == QA:
        from pipeline.kinds.squad import read_qa
        from serving.validation import Question

        return [Question(q.question, q.context) for q in read_qa(path).questions]
    return load_texts(path, artifact_columns(artifact, task))


def body_of(item) -> bytes:
    if isinstance(item, tuple):
        inputs = {"text": item[0], "text_pair": item[1]}
    elif isinstance(item, str):
        inputs = item
    else:  # a Question
        inputs = {"question": item.question, "context": item.context}
    return json.dumps({"inputs": inputs}).encode()


def best(answer) -> dict | list:
    """What is compared of an item's answer: the top label, the entities, or the best answer."""
    ranked = isinstance(answer, list) and answer and ("label" in answer[0] or "answer" in answer[0])
    return answer[0] if ranked else answer


def same_answer(a, b) -> tuple[bool, float]:
    """(equal apart from scores, largest score difference) of two answers as `best` gives them."""
    a, b = ([a], [b]) if isinstance(a, dict) else (a, b)
    keys = lambda x: {k: v for k, v in x.items() if k != "score"}  # noqa: E731
    if len(a) != len(b) or any(keys(x) != keys(y) for x, y in zip(a, b, strict=True)):
        return False, float("inf")
    return True, max((abs(x["score"] - y["score"]) for x, y in zip(a, b, strict=True)), default=0.0)


class Connection:
    """One keep-alive HTTP/1.1 connection (Content-Length bodies only, which is what the server sends)."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{self.extra}\r\n"
        )
        self.writer.write(head.encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def run_load(
    url: str, texts: list[str | tuple[str, str]], n: int, concurrency: int, duration: float, headers: dict[str, str]
) -> dict:
    """`n` requests (or until `duration` seconds pass) over `concurrency` connections."""
    parts = urlsplit(url)
    bodies = [body_of(t) for t in texts]
    latencies, statuses, labels = [], {}, {}
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        conn = Connection(parts.hostname, parts.port, headers)
        try:
            while next_index < n and time.perf_counter() < deadline:
                i, next_index = next_index, next_index + 1
                start = time.perf_counter()
                try:
                    status, data = await conn.request("POST", "/predict", bodies[i % len(bodies)])
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    status, data = -1, b""
                    await conn.close()
                latencies.append(time.perf_counter() - start)
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200:
                    labels[i] = best(json.loads(data))
        finally:
            await conn.close()

    # warm-up: a round per connection, not counted
    warm = [Connection(parts.hostname, parts.port, headers) for _ in range(concurrency)]
    await asyncio.gather(*(c.request("POST", "/predict", bodies[0]) for c in warm))
    for c in warm:
        await c.close()
    deadline = time.perf_counter() + duration
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    done = len(latencies)
    return {
        "requests": done,
        "seconds": elapsed,
        "throughput": done / elapsed,
        "concurrency": concurrency,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": done - statuses.get(200, 0),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "labels": labels,
    }


async def scrape(url: str, headers: dict[str, str]) -> dict[str, float]:
    """The batch-size sums and counts from /metrics."""
    parts = urlsplit(url)
    conn = Connection(parts.hostname, parts.port, headers)
    try:
        status, data = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    if status != 200:
        return {}
    found = re.findall(r"^(serving_batch_(?:size|requests)_(?:sum|count)) (\S+)$", data.decode(), re.M)
    return {k: float(v) for k, v in found}


def _run(coro):
    """uvloop when installed: the client then takes less CPU from the server it measures."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def bare_session(artifact: Path, precision: str, threads: int | None, texts: list, batch: int) -> dict:
    """The same texts through an ArtifactSession built like the server's, in chunks of `batch`."""
    from serving.config import available_cores
    from serving.session import ArtifactSession

    session = ArtifactSession(artifact, precision, threads=threads or available_cores(), spinning=False)
    session.predict(texts[:batch])  # warm-up
    start = time.perf_counter()
    scores = [session.predict(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    elapsed = time.perf_counter() - start
    return {
        "texts": len(texts),
        "batch": batch,
        "seconds": elapsed,
        "throughput": len(texts) / elapsed,
        "labels": [best(answer) for chunk in scores for answer in chunk],
    }


def pipeline_reader_missing(task: dict, precision: str) -> str | None:
    """Why `--pipeline` cannot run here (None: it can). The pipeline reads the served graph through Optimum's
    ORTModel where optimum-onnx is installed (transformers < 4.58), else the artifact's torch model, which is the
    fp32 graph's model only; transformers 5 has no question-answering pipeline."""
    if task_kind(task) == QA and not question_answering_pipeline():
        return "--pipeline: this transformers has no question-answering pipeline (5.x removed it)"
    if precision != "fp32" and not optimum_onnx():
        return "--pipeline with --precision int8 reads the int8 graph through optimum-onnx, not installed here"
    return None


def pipeline_answers(artifact: Path, task: dict, items: list, precision: str) -> list:
    """transformers' pipeline over the served graph (Optimum's ORTModel; without optimum-onnx, over the artifact's
    torch model, for the fp32 graph), answering as the server does by default: text classification's top label;
    entities grouped "simple"; the best answer of spans of at most 30 tokens over windows of the artifact's trained
    length overlapping as the server's (`task`: its task block)."""
    from transformers import AutoTokenizer, pipeline

    from serving.artifact import HEAD_SUFFIXES, PYTORCH, pipeline_tag
    from serving.spans import MAX_ANSWER_LEN, window_stride

    kind, max_length = task_kind(task), trained_length(task)
    if optimum_onnx():
        import optimum.onnxruntime as ort_models

        model = getattr(ort_models, f"ORTModel{HEAD_SUFFIXES[kind]}").from_pretrained(
            artifact, file_name=GRAPHS[precision]
        )
    else:
        from pipeline.models.io import load_model

        model = load_model(artifact / PYTORCH)
    tokenizer = AutoTokenizer.from_pretrained(artifact, model_max_length=max_length)
    pipe = pipeline(pipeline_tag(kind), model=model, tokenizer=tokenizer)
    if kind == QA:
        return [pipe(question=q.question, context=q.context, max_answer_len=MAX_ANSWER_LEN, max_seq_len=max_length,
                     doc_stride=window_stride(max_length)) for q in items]  # fmt: skip
    if kind == TOKEN:
        return [pipe(text, aggregation_strategy="simple") for text in items]
    pairs = [{"text": t[0], "text_pair": t[1]} if isinstance(t, tuple) else t for t in items]
    return [best(pipe(p, top_k=1)) for p in pairs]


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    options = ["--precision", args.precision, "--max-batch", str(args.max_batch),
               "--max-wait-ms", str(args.max_wait_ms), "--max-queue", str(max(256, 2 * args.concurrency))]  # fmt: skip
    return launch_server(args.artifact, options, args.threads, log)


def launch_server(artifact: Path, options: list[str], threads: int | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`python -m serving ARTIFACT OPTIONS` on a free loopback port; returns the process and its URL once it
    listens (the script exits with one line if it does not start)."""
    cmd = [sys.executable, "-m", "serving", str(artifact), "--host", "127.0.0.1", "--port", "0", *options]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            sys.exit(f"error: the server exited: {log.read_text().strip()}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("error: the server did not start within 300 s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path, help="artifact folder (served, and used for the bare-session comparison)")
    p.add_argument("--url", help="a running server on loopback (default: start one on a free port)")
    p.add_argument("--api-key", default=os.environ.get("SERVING_API_KEY"), help="key for a server that needs one")
    p.add_argument("--requests", type=int, default=1000, help="requests to send (%(default)s; at most 100000)")
    p.add_argument("--concurrency", type=int, default=32, help="open connections (%(default)s; at most 512)")
    p.add_argument("--duration", type=float, default=300, help="stop sending after this many seconds (%(default)s)")
    p.add_argument(
        "--texts",
        type=Path,
        default=DEFAULT_TEXTS,
        help="TSV with the artifact's text column(s), or one text per line",
    )
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--max-batch", type=int, default=32, help="the server's max batch (also the bare batch size)")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: available cores)")
    p.add_argument("--no-baseline", action="store_true", help="skip the bare-session comparison")
    p.add_argument("--pipeline", type=int, default=0, metavar="N",
                   help="compare the first N distinct served answers with transformers' pipeline's")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if not (1 <= args.requests <= 100_000 and 1 <= args.concurrency <= 512 and 0 < args.duration <= 3600):
        p.error("--requests must be 1..100000, --concurrency 1..512, --duration 0..3600 s")
    if args.url and urlsplit(args.url).hostname not in LOOPBACK:
        p.error("--url must be a loopback address (127.0.0.1, localhost or ::1)")
    task = artifact_task(args.artifact)
    if args.pipeline and (missing := pipeline_reader_missing(task, args.precision)):
        p.error(missing)
    texts = load_items(args.texts, args.artifact, task)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    proc, log = None, Path(tempfile.mkstemp(prefix="load-test-server-", suffix=".log")[1])
    url = args.url
    if url is None:
        proc, url = start_server(args, log)
    try:
        before = _run(scrape(url, headers))
        server = _run(run_load(url, texts, args.requests, args.concurrency, args.duration, headers))
        after = _run(scrape(url, headers))
    finally:
        if proc is not None:  # stop it before the bare run, so the two never share the cores
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        log.unlink(missing_ok=True)
    served_labels = server.pop("labels")
    batches = after.get("serving_batch_size_count", 0) - before.get("serving_batch_size_count", 0)
    if batches:
        server["mean_batch_texts"] = (after["serving_batch_size_sum"] - before["serving_batch_size_sum"]) / batches
    print(
        f"server: {server['requests']} requests at concurrency {args.concurrency} in {server['seconds']:.1f} s: "
        f"{server['throughput']:.1f} req/s, p50 {server['p50_ms']:.1f} ms, p99 {server['p99_ms']:.1f} ms, "
        f"errors {server['errors']} (status counts {server['statuses']})"
        + (f", mean batch {server['mean_batch_texts']:.1f} texts" if batches else "")
    )
    result = {"server": server, "url": url, "precision": args.precision, "max_batch": args.max_batch}
    if not args.no_baseline:
        sent = [texts[i % len(texts)] for i in range(server["requests"])]
        bare = bare_session(args.artifact, args.precision, args.threads, sent, args.max_batch)
        bare_labels = bare.pop("labels")
        compared = [same_answer(top, bare_labels[i]) for i, top in served_labels.items()]
        same = [ok for ok, _ in compared if ok]
        diff = max((d for ok, d in compared if ok), default=0.0)
        result.update(
            bare=bare,
            ratio=server["throughput"] / bare["throughput"],
            labels_equal=len(same),
            labels_compared=len(served_labels),
            max_score_diff=diff,
        )
        print(
            f"bare ArtifactSession at batch {args.max_batch}: {bare['texts']} texts in {bare['seconds']:.1f} s: "
            f"{bare['throughput']:.1f} texts/s"
        )
        print(
            f"ratio server/bare: {result['ratio']:.2f}; answers equal for {len(same)}/{len(served_labels)} served "
            f"items, max |score difference| {diff:.1e}"
        )
    if args.pipeline:
        served = {}  # the first N distinct items served, by their index in `texts`
        for i, answer in sorted(served_labels.items()):
            served.setdefault(i % len(texts), answer)
        firsts = sorted(served)[: args.pipeline]
        reference = pipeline_answers(args.artifact, task, [texts[i] for i in firsts], args.precision)
        checks = [same_answer(served[i], r) for i, r in zip(firsts, reference, strict=True)]
        result.update(pipeline_equal=sum(ok for ok, _ in checks), pipeline_compared=len(checks))
        diff = max((d for ok, d in checks if ok), default=0.0)
        print(f"transformers pipeline: answers equal for {result['pipeline_equal']}/{len(checks)} items, "
              f"max |score difference| {diff:.1e}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if server["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
