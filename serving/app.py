"""The HTTP layer (Starlette): Hugging Face style `/predict`, the Open Inference Protocol v2 (with the binary
tensor data extension), health, metrics, for every task kind the artifact may be of.

Every handler runs through one wrapper that checks the API key, turns refusals into a JSON `{"error": ...}`
with a 4xx/5xx status, and records the request in the metrics; nothing a client sends can stop the server.
A request's texts are tokenised on a pool of tokeniser threads, then go through the micro-batcher; the model
runs on its single worker thread, which only pads and runs the graph; entities and answers are decoded from its
rows on the tokeniser threads again: tokenising or decoding a large request holds up neither the event loop
(health, metrics) nor other requests' model calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Any, Protocol

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serving.artifact import EMBEDDING, SEQUENCE
from serving.batcher import MicroBatcher, QueueFull, ShuttingDown
from serving.binary import HEADER_LENGTH, BinaryError, response_body, split_body, tensor_bytes
from serving.config import ServerConfig
from serving.kinds import served_kind
from serving.kinds.embedding import embed_request
from serving.metrics import CONTENT_TYPE, Metrics
from serving.validation import Limits, RequestError, decode_json, parse_infer, parse_predict

log = logging.getLogger("serving")
MODEL_VERSION = "1"
# Threads that tokenise requests and decode their answers, in two lanes: requests of at most SMALL_REQUEST_CHARS
# characters in all have threads of their own, so that they never wait for a thread behind large ones. The large
# lane has few threads: tokenising windows and decoding spans is partly Python, and every thread more that holds
# the GIL for a large request delays each step of a small one (the event loop included).
TOKENIZER_THREADS = {"small": 2, "large": 2}
SMALL_REQUEST_CHARS = 4096
Handler = Callable[[Request], Awaitable[Response]]


class Model(Protocol):
    """What the server needs from a model: `ArtifactSession` is one (`pair`: it reads (text, text_pair) tuples;
    `kind`: the task kind, sequence classification when absent).

    `encode` tokenises one request's items on a tokeniser thread (into what the model runs: one encoding per text,
    or several windows per question); `run` computes the rows of the encodings of one or more requests (one per
    encoding) on the model thread; `tokens` is an encoding's length, which the batcher's token budget counts.
    Token classification and question answering turn their rows into entities and answers with `answer`.
    """

    labels: list[str]
    pair: bool

    def encode(self, items: list) -> list[Any]: ...

    def tokens(self, item: Any) -> int: ...

    def run(self, encoded: list[Any]) -> np.ndarray: ...

    def answer(self, items: list, encoded: list, rows: np.ndarray, top_k: int | None, max_answer_len: int) -> list: ...


def json_response(content: Any, status: int = 200, headers: dict | None = None) -> Response:
    body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(body, status, headers=headers, media_type="application/json")


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    return json_response({"error": message}, status, headers)


# A refused body is still read (and dropped) up to this many bytes before the 413 goes out: closing a socket with
# unread data resets the connection, and a client still sending would see the reset instead of the 413.
DRAIN_BYTES = 1 << 20


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with a 413 once it is known to exceed `limit` (from Content-Length, or while streaming a
    chunked body). What follows is dropped, not kept, and read only up to `DRAIN_BYTES`."""
    declared = request.headers.get("content-length")
    refused = None
    if declared is not None and declared.isdigit() and int(declared) > limit:
        refused = RequestError(413, f"request body is {int(declared)} bytes; at most {limit}", "body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if refused is None and size > limit:
                refused = RequestError(413, f"request body exceeds {limit} bytes", "body_too_large")
                chunks.clear()
            if refused is None:
                chunks.append(chunk)
            elif size > limit + DRAIN_BYTES:
                break
    except ClientDisconnect:
        if refused is None:
            raise RequestError(400, "client disconnected while sending the body", "disconnected") from None
    if refused is not None:
        raise refused
    return b"".join(chunks)


def _chars(items: list) -> int:
    """The characters of a request's items: texts, (text, text_pair) pairs or questions with their contexts."""

    def chars(item: Any) -> int:
        if isinstance(item, str):
            return len(item)
        if isinstance(item, tuple):
            return sum(len(t) for t in item)
        return len(getattr(item, "question", "")) + len(getattr(item, "context", ""))

    return sum(map(chars, items))


class Service:
    """The served model behind its batcher, and the request handlers."""

    def __init__(self, config: ServerConfig, model: Model, model_name: str) -> None:
        self.config = config
        self.model = model
        self.name = model_name
        self.labels = list(model.labels)
        self.pair = model.pair
        self.kind = getattr(model, "kind", SEQUENCE)
        self.served = served_kind(self.kind)
        self.task = getattr(model, "task", None) or {}
        self.limits = Limits(config.max_items, config.max_text_chars)
        self.batcher = MicroBatcher(
            model.run,
            config.max_batch,
            config.max_wait_ms / 1000,
            config.max_queue,
            max_queue_items=config.max_queue * config.max_batch,
            max_tokens=config.max_batch_tokens,
            tokens=model.tokens,
        )
        self.metrics = Metrics(model_name, config.precision, lambda: self.batcher.queued)
        self.batcher.on_batch = self.metrics.observe_batch
        self._key = config.api_key.encode() if config.api_key else None
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._tokenizing = 0  # requests on the tokeniser threads: they count against max_queue too

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        self._lanes = {lane: ThreadPoolExecutor(n, thread_name_prefix=f"tokenizer-{lane}")
                       for lane, n in TOKENIZER_THREADS.items()}  # fmt: skip
        await self.batcher.start()
        try:
            yield
        finally:
            if self.batcher.queued:
                log.info("shutting down: finishing %d queued requests", self.batcher.queued)
            await self.batcher.stop()
            for pool in self._lanes.values():
                pool.shutdown(wait=True)

    async def rows(self, items: list) -> tuple[list, np.ndarray]:
        """Tokenise `items` on a tokeniser thread, then queue them for the model: (the encodings, a row of outputs
        per encoding).

        Raises:
            QueueFull: `max_queue` requests are already being tokenised or waiting for the model.
            ShuttingDown: the server is stopping.
        """
        self.batcher.check_capacity(self._tokenizing)  # refuse before the work, not after it
        self._tokenizing += 1
        start = time.perf_counter()
        try:
            encoded = await self._off_loop(_chars(items), self.model.encode, items)
        finally:
            self._tokenizing -= 1
        self.metrics.observe_tokenization(time.perf_counter() - start)
        self.served.check_encoded(encoded, self.config)  # any model's, the session's own early checks aside
        return encoded, await self.batcher.submit(encoded)

    async def _off_loop(self, size: int, function: Callable, *args: Any) -> Any:
        """`function(*args)` on a tokeniser thread of the lane of a request of `size` characters (or bytes): parsing,
        tokenising or decoding a large request's entities or answers takes long enough that on the event loop it
        would hold up health probes, metrics and every other request."""
        lane = "small" if size <= SMALL_REQUEST_CHARS else "large"
        return await asyncio.get_running_loop().run_in_executor(self._lanes[lane], function, *args)

    async def _parsed(self, body: bytes, parse: Callable[[Any], Any]) -> Any:
        """`parse` of the JSON `body`: on the event loop for a small body, on the large lane for a large one."""
        if len(body) <= SMALL_REQUEST_CHARS:
            return parse(decode_json(body))
        return await self._off_loop(len(body), lambda: parse(decode_json(body)))

    # -- the wrapper every route goes through -------------------------------------------------------------
    def endpoint(self, name: str, handler: Handler, auth: bool = True) -> Handler:
        async def run(request: Request) -> Response:
            start = time.perf_counter()
            reason = None
            try:
                if auth:
                    self._authorize(request)
                response = await handler(request)
            except RequestError as e:
                reason = e.reason
                headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
                if e.status == 413:  # the unread rest of the body must not be taken for the next request
                    headers = {"Connection": "close"}
                response = error_response(e.status, e.message, headers)
            except (QueueFull, ShuttingDown) as e:
                reason = "queue_full" if isinstance(e, QueueFull) else "shutting_down"
                response = error_response(503, str(e), {"Retry-After": "1"})
            except Exception as e:
                log.exception("%s failed", name)
                reason = "internal"
                response = error_response(500, f"internal error: {type(e).__name__}")
            self.metrics.observe_request(name, response.status_code, time.perf_counter() - start, reason)
            return response

        return run

    def _authorize(self, request: Request) -> None:
        if self._key is None:
            return
        given = request.headers.get("x-api-key")
        if given is None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(given.encode("latin-1", "replace"), self._key):
            raise RequestError(
                401, "missing or wrong API key (send 'Authorization: Bearer KEY' or 'X-API-Key: KEY')", "unauthorized"
            )

    def _check_model(self, request: Request) -> None:
        name = request.path_params["name"]
        if name != self.name:
            raise RequestError(404, f"unknown model {name[:100]!r}; this server serves {self.name!r}", "unknown_model")
        version = request.path_params.get("version", MODEL_VERSION)
        if version != MODEL_VERSION:
            raise RequestError(
                404,
                f"unknown version {version[:40]!r} of model {self.name!r}; versions: {MODEL_VERSION}",
                "unknown_version",
            )

    # -- handlers -------------------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if self.batcher.running:
            return json_response({"ready": True})
        return json_response({"ready": False, "error": "the model worker is not running"}, 503)

    async def server_metadata(self, request: Request) -> Response:
        try:
            version = metadata.version("encoder-deploy")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return json_response(
            {"name": "encoder-deploy-serving", "version": version, "extensions": ["binary_tensor_data"]}
        )

    async def model_metadata(self, request: Request) -> Response:
        self._check_model(request)
        shapes = self.served.output_shapes(self.labels)
        return json_response(
            {
                "name": self.name,
                "versions": [MODEL_VERSION],
                "platform": "onnxruntime_onnx",
                "inputs": [
                    {"name": name, "datatype": "BYTES", "shape": [-1]} for name in self.served.input_names(self.pair)
                ],
                "outputs": [{"name": name, "datatype": d, "shape": shape} for name, (d, shape) in shapes.items()],
                "parameters": {
                    "kind": self.kind,
                    "labels": self.labels,
                    "pair": self.pair,
                    "task": self.task.get("name"),
                    "precision": self.config.precision,
                    "max_tokens": getattr(self.model, "max_length", self.config.max_length),
                    "max_batch": self.config.max_batch,
                },
            }
        )

    async def model_ready(self, request: Request) -> Response:
        self._check_model(request)
        ready = self.batcher.running
        return json_response({"name": self.name, "ready": ready}, 200 if ready else 503)

    async def infer(self, request: Request) -> Response:
        self._check_model(request)
        body = await read_body(request, self.config.max_body_bytes)
        try:
            header, binary = split_body(body, request.headers.get(HEADER_LENGTH))
        except BinaryError as e:
            raise RequestError(400, str(e), "bad_binary") from None
        parse = functools.partial(parse_infer, limits=self.limits, pair=self.pair, kind=self.served, binary=binary)
        req = await self._parsed(header, parse)
        encoded, rows = await self.rows(req.texts)
        args = (self.model, req.texts, encoded, rows, req.outputs)
        tensors = await self._decoded(req.texts, self.served.tensors, *args)
        outputs, data = [], {}
        for name in req.outputs:
            datatype, shape, values = tensors[name]
            out = {"name": name, "datatype": datatype, "shape": shape}
            if name in req.binary:
                data[name] = tensor_bytes(datatype, values)
                out["parameters"] = {"binary_data_size": len(data[name])}
            else:
                out["data"] = values
            outputs.append(out)
        out = {"model_name": self.name, "model_version": MODEL_VERSION, "outputs": outputs}
        if req.id is not None:
            out["id"] = req.id
        content, headers = response_body(out, data)
        media = "application/octet-stream" if data else "application/json"
        return Response(content, headers=headers, media_type=media)

    async def _decoded(self, items: list, function: Callable, *args: Any) -> Any:
        """`function(*args)`: answers decoded from the rows (entities, spans) on a tokeniser thread, labels (taken
        straight from the rows) on the event loop."""
        if not self.served.decodes:
            return function(*args)
        return await self._off_loop(_chars(items), function, *args)

    async def predict(self, request: Request) -> Response:
        body = await read_body(request, self.config.max_body_bytes)
        parse = functools.partial(parse_predict, limits=self.limits, pair=self.pair, kind=self.served)
        req = await self._parsed(body, parse)
        encoded, rows = await self.rows(req.texts)
        result = await self._decoded(req.texts, self.served.predict, self.model, req, encoded, rows)
        return json_response(result[0] if req.single else result)

    async def embed(self, request: Request) -> Response:
        """Text Embeddings Inference's `/embed` (`serving.kinds.embedding.embed_request`): a list of vectors."""
        body = await read_body(request, self.config.max_body_bytes)
        req = await self._parsed(body, functools.partial(embed_request, limits=self.limits))
        _, rows = await self.rows(req.texts)
        return json_response(self.served.answer(self.model, req.texts, [], rows, None, 0))

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    # -- errors outside the handlers: unknown paths and methods -----------------------------------------------
    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path[:200]}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path[:200]}"
        else:
            message = str(exc.detail)
        reason = "no_route" if exc.status_code in (404, 405) else "http"
        self.metrics.observe_request("other", exc.status_code, 0.0, reason)
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    async def server_error(self, request: Request, exc: Exception) -> Response:
        self.metrics.observe_request("other", 500, 0.0, "internal")
        return error_response(500, f"internal error: {type(exc).__name__}")


def build_app(config: ServerConfig, model: Model, model_name: str) -> Starlette:
    """The ASGI app serving `model` as `model_name` (the batcher starts and stops with the app's lifespan)."""
    s = Service(config, model, model_name)
    model_paths = ["/v2/models/{name}", "/v2/models/{name}/versions/{version}"]
    routes = [
        Route("/predict", s.endpoint("predict", s.predict), methods=["POST"]),
        Route("/metrics", s.endpoint("metrics", s.metrics_page), methods=["GET"]),
        *([Route("/embed", s.endpoint("embed", s.embed), methods=["POST"])] if s.served.name == EMBEDDING else []),
        Route("/v2", s.endpoint("metadata", s.server_metadata), methods=["GET"]),
    ]
    for prefix in ("/v2/health", "/health"):
        routes += [
            Route(f"{prefix}/live", s.endpoint("health", s.live, auth=False), methods=["GET"]),
            Route(f"{prefix}/ready", s.endpoint("health", s.ready, auth=False), methods=["GET"]),
        ]
    for path in model_paths:
        routes += [
            Route(path, s.endpoint("metadata", s.model_metadata), methods=["GET"]),
            Route(f"{path}/ready", s.endpoint("health", s.model_ready), methods=["GET"]),
            Route(f"{path}/infer", s.endpoint("infer", s.infer), methods=["POST"]),
        ]
    app = Starlette(
        routes=routes, lifespan=s.lifespan, exception_handlers={HTTPException: s.http_error, Exception: s.server_error}
    )
    # `/predict/` is a 404 like any unknown path, not a redirect to a Location built from the Host header
    app.router.redirect_slashes = False
    app.state.service = s
    return app
