"""`python -m serving ARTIFACT_DIR [options]`: the server's command line, with only the serving requirements."""

from __future__ import annotations

import argparse
import os
import sys

from serving.config import API_KEY_ENV, DEVICES, PRECISIONS, ServerConfig

# Every option once: the ServerConfig field it sets, its flag, and argparse's settings (its default is the field's).
OPTIONS: tuple[tuple[str, str, dict], ...] = (
    ("host", "--host", {"help": "address to bind (default %(default)s; 0.0.0.0 for all interfaces)"}),
    ("port", "--port", {"type": int, "help": "port (default %(default)s; 0: any free port)"}),
    ("precision", "--precision", {"choices": PRECISIONS, "help": "graph to serve (fp16: for CUDA)"}),
    ("device", "--device", {"choices": DEVICES, "help": "cpu, or cuda: ONNX Runtime's CUDA provider, with IOBinding"}),
    ("model_name", "--model-name", {"help": "name in the /v2/models/{name} URLs (default: the artifact's)"}),
    ("api_key", "--api-key",
     {"help": f"require this key (Authorization: Bearer KEY or X-API-Key); default: ${API_KEY_ENV}"}),
    ("max_batch", "--max-batch", {"type": int, "help": "most texts per model call (%(default)s)"}),
    ("max_batch_tokens", "--max-batch-tokens",
     {"type": int, "help": "most padded tokens per model call, texts x longest (%(default)s)"}),
    ("max_wait_ms", "--max-wait-ms",
     {"type": float, "help": "wait for more requests after the first of a batch (%(default)s ms)"}),
    ("max_queue", "--max-queue",
     {"type": int, "help": "most requests waiting for the model (and max-queue x max-batch texts); more get 503 "
                           "(%(default)s)"}),
    ("threads", "--threads", {"type": int, "help": "ORT intra-op threads (default: available cores)"}),
    ("max_body_bytes", "--max-body-bytes", {"type": int, "help": "largest body (%(default)s)"}),
    ("max_items", "--max-items", {"type": int, "help": "most texts per request (%(default)s)"}),
    ("max_text_chars", "--max-text-chars", {"type": int, "help": "longest text in characters (%(default)s)"}),
    ("max_windows", "--max-windows",
     {"type": int, "help": "most question-answering windows per request, over all its contexts (%(default)s)"}),
    ("max_length", "--max-length",
     {"type": int, "help": "tokens per text (a QA window); longer texts are truncated, keeping the start (default: "
                           "the length the artifact was trained at, else 128)"}),
    ("graceful_timeout_s", "--graceful-timeout",
     {"type": float, "help": "seconds in-flight requests get to finish on SIGTERM (%(default)s)"}),
    ("access_log", "--access-log", {"action": "store_true", "help": "log every request"}),
    ("trust_key", "--trust-key",
     {"help": "a public key (PEM): refuse the artifact unless its signature (model.sig) verifies with it"}),
)  # fmt: skip


def parser(prog: str = "python -m serving") -> argparse.ArgumentParser:
    """The server's options: the one definition (`pipeline serve` passes its arguments here), defaults from
    `ServerConfig`."""
    defaults = ServerConfig(artifact=".")
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve an artifact folder over HTTP: POST /predict, Open Inference Protocol v2 under /v2, "
        "Prometheus metrics at /metrics.",
    )
    p.add_argument("artifact", help="artifact folder (model.onnx, model.int8.onnx, tokenizer.json, manifest.json)")
    for field, flag, settings in OPTIONS:
        default = None if field == "api_key" else getattr(defaults, field)  # None: read from the environment
        if settings.get("action") != "store_true":
            settings = {"metavar": flag.removeprefix("--").replace("-", "_").upper(), **settings}
        p.add_argument(flag, dest=field, default=default, **settings)
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    values = {field: getattr(args, field) for field, _, _ in OPTIONS}
    if values["api_key"] is None:
        values["api_key"] = os.environ.get(API_KEY_ENV)
    return ServerConfig(artifact=args.artifact, **values)


def main(argv: list[str] | None = None, prog: str = "python -m serving") -> int:
    args = parser(prog).parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from serving.server import serve

    return serve(config)
