"""Start-up: check and load the artifact, bind the socket, run uvicorn until SIGTERM/SIGINT, then drain.

Start-up problems (a tampered or incomplete artifact, a port in use) end the process with exit code 2 and one
`error:` line on stderr. On SIGTERM or SIGINT uvicorn stops accepting connections, lets in-flight requests
finish (up to `graceful_timeout_s`), and the app's lifespan then drains the batcher's queue.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading

from serving.artifact import MANIFEST, ArtifactError
from serving.config import ServerConfig
from serving.session import ArtifactSession

log = logging.getLogger("serving")


class StartupError(Exception):
    """The server cannot start; the message is the one line printed."""


def model_name(config: ServerConfig) -> str:
    if config.model_name:
        return config.model_name
    try:
        return json.loads((config.artifact / MANIFEST).read_text())["artifact"]
    except (OSError, ValueError, KeyError, TypeError):
        return config.artifact.resolve().name


def load_model(config: ServerConfig) -> ArtifactSession:
    """The artifact's session (checked against manifest.json, and its signature with a trusted key), warmed up
    with one call."""
    if not config.artifact.is_dir():
        raise StartupError(f"artifact folder not found: {config.artifact}")
    try:
        session = ArtifactSession(
            config.artifact,
            config.precision,
            device=config.device,
            threads=config.intra_op_threads,
            max_length=config.max_length,
            max_windows=config.max_windows,
            spinning=False,
            trust_key=config.trust_key,
        )
    except ArtifactError as e:
        raise StartupError(f"refusing to serve: {e}") from None
    except Exception as e:  # ORT or tokenizers could not read a file that matches the manifest
        first_line = (str(e).splitlines() or [""])[0][:300]
        raise StartupError(f"cannot load {config.artifact}: {type(e).__name__}: {first_line}") from None
    # the first ORT run allocates; keep it out of the first request's latency
    session.predict([session.served.warm_up(session.pair)])
    return session


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is IPPROTO_TCP, and with it on,
    # a keep-alive client's next response (headers and body are two writes) waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)  # connections made from now on wait in the backlog until uvicorn accepts them
    return sock


def _setup_logging() -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    log.propagate = False


def serve(config: ServerConfig) -> int:
    """Run the server until it is stopped; returns the exit code."""
    _setup_logging()
    # Each request is tokenised on a tokeniser thread of the app's. The tokenizer's own thread pool (rayon) would
    # queue a one-text request's tokenisation behind a large request's (and size itself to every CPU on the host).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # A thread waiting for the GIL gets it after this long at most: with large requests' decoding holding it, each
    # step of a small request (the event loop's, its tokeniser thread's) would otherwise wait up to 5 ms per turn.
    sys.setswitchinterval(0.001)
    import uvicorn

    from serving.app import build_app

    try:
        model = load_model(config)
        sock = bind(config.host, config.port)
    except StartupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = model_name(config)
    host, port = sock.getsockname()[:2]
    app = build_app(config, model, name)
    uv = uvicorn.Server(
        uvicorn.Config(
            app,
            lifespan="on",
            access_log=config.access_log,
            log_level="info" if config.access_log else "warning",
            timeout_graceful_shutdown=config.graceful_timeout_s,
            server_header=False,
        )
    )
    if config.api_key is None and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s without an API key", host)
    url_host = f"[{host}]" if ":" in host else host
    log.info(
        "serving %s (%s, %s intra-op threads, max batch %d, max wait %g ms, max queue %d) on http://%s:%d",
        name,
        config.precision,
        config.intra_op_threads,
        config.max_batch,
        config.max_wait_ms,
        config.max_queue,
        url_host,
        port,
    )
    # uvicorn re-raises the signal that stopped it once it has drained; answered by a no-op here, the process
    # logs and exits 0 after a graceful stop instead of dying of that signal.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    uv.run(sockets=[sock])
    log.info("stopped")
    return 0
