"""`python -m serving ARTIFACT_DIR [options]`: the server's command line, with only the serving requirements."""

from __future__ import annotations

import argparse
import os
import sys

from serving.config import API_KEY_ENV, ServerConfig


def parser(prog: str = "python -m serving") -> argparse.ArgumentParser:
    """The server's options: the one definition (`pipeline serve` passes its arguments here), defaults from
    `ServerConfig`."""
    d = ServerConfig(artifact=".")
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve an artifact folder over HTTP: POST /predict, Open Inference Protocol v2 under /v2, "
        "Prometheus metrics at /metrics.",
    )
    p.add_argument("artifact", help="artifact folder (model.onnx, model.int8.onnx, tokenizer.json, manifest.json)")
    p.add_argument("--host", default=d.host, help="address to bind (default %(default)s; 0.0.0.0 for all interfaces)")
    p.add_argument("--port", type=int, default=d.port, help="port (default %(default)s; 0: any free port)")
    p.add_argument("--precision", choices=("fp32", "int8"), default=d.precision, help="graph to serve")
    p.add_argument("--model-name", default=None, help="name in the /v2/models/{name} URLs (default: the artifact's)")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require this key (Authorization: Bearer KEY or X-API-Key); default: ${API_KEY_ENV}",
    )
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="most texts per model call (%(default)s)")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="most padded tokens per model call, texts x longest (%(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=d.max_wait_ms,
        help="wait for more requests after the first of a batch (%(default)s ms)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help="most requests waiting for the model; more get 503 (%(default)s)",
    )
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: available cores)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest body (%(default)s)")
    p.add_argument("--max-items", type=int, default=d.max_items, help="most texts per request (%(default)s)")
    p.add_argument(
        "--max-text-chars", type=int, default=d.max_text_chars, help="longest text in characters (%(default)s)"
    )
    p.add_argument(
        "--max-windows",
        type=int,
        default=d.max_windows,
        help="most question-answering windows per request, over all its contexts (%(default)s)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=d.max_length,
        help="tokens per text (a QA window); longer texts are truncated, keeping the start (default: the length the "
        "artifact was trained at, else 128)",
    )
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=d.graceful_timeout_s,
        help="seconds in-flight requests get to finish on SIGTERM (%(default)s)",
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument(
        "--trust-key",
        default=None,
        help="a public key (PEM): refuse the artifact unless its signature (model.sig) verifies with it",
    )
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        artifact=args.artifact,
        host=args.host,
        port=args.port,
        precision=args.precision,
        model_name=args.model_name,
        api_key=args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV),
        max_batch=args.max_batch,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        threads=args.threads,
        max_body_bytes=args.max_body_bytes,
        max_items=args.max_items,
        max_text_chars=args.max_text_chars,
        max_windows=args.max_windows,
        max_length=args.max_length,
        graceful_timeout_s=args.graceful_timeout,
        access_log=args.access_log,
        trust_key=args.trust_key,
    )


def main(argv: list[str] | None = None, prog: str = "python -m serving") -> int:
    args = parser(prog).parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from serving.server import serve

    return serve(config)
