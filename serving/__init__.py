"""Serving runtime: ONNX Runtime over an artifact folder, with the fast tokenizer and no torch.

session.py     ArtifactSession: manifest check, Rust tokenizer, one ORT session (the reference predictions, every kind)
spans.py       entities and answers decoded from per-token outputs, as transformers' pipelines decode them
bounded.py     BoundedTokenizer: only the part of a long text that max_length tokens can use is tokenised
batcher.py     MicroBatcher: concurrent requests gathered into one model call on a single worker thread
validation.py  request parsing; every malformed body becomes a 4xx RequestError naming the problem
binary.py      the Open Inference Protocol's binary tensor data extension (what tritonclient sends)
app.py         the HTTP layer (Starlette): /predict, Open Inference Protocol v2, health, /metrics
metrics.py     Prometheus metrics in a registry of their own
config.py      ServerConfig and the core count
server.py      start-up (integrity check, bind), uvicorn, graceful shutdown
cli.py         `python -m serving ARTIFACT_DIR [options]` (also `pipeline serve`)
"""
