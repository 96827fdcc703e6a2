# Two images from one file.
#
# serve: the slim serving image. ONNX Runtime, the Rust tokenizer and the HTTP server (serving/requirements.txt);
# no torch, no transformers, no Prefect. It serves the artifact folder mounted at /artifact on port 8000.
#   docker build --target serve -t encoder-deploy:serve .
#   docker run --rm -v "$PWD/artifacts/sst2-mlp_fusion-XXXXXXXX:/artifact:ro" -p 127.0.0.1:8000:8000 \
#       -e SERVING_API_KEY=change-me encoder-deploy:serve [--precision int8 --max-batch 32 ...]
#
# pipeline (the default target, last in this file): runs `pipeline deploy` (CPU by default; CUDA base image as
# a build argument).
#   docker build -t encoder-deploy .
#   docker run --rm -v "$PWD/artifacts:/app/artifacts" -v "$PWD/data:/data:ro" encoder-deploy \
#       deploy --method mlp_fusion --task sst2 --data-dir /data/sst2
# GPU:  docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg TORCH_INDEX=cu128 -t encoder-deploy:gpu .
ARG BASE=python:3.11-slim
ARG SERVE_BASE=python:3.11-slim

# ---------------------------------------------------------------------------------------------------------------
FROM ${SERVE_BASE} AS serve
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
# The same install step the clean-venv test runs: the full pinned set, nothing resolved at build time.
COPY serving/requirements.txt /tmp/serving-requirements.txt
RUN pip install --no-deps -r /tmp/serving-requirements.txt && pip check && rm /tmp/serving-requirements.txt
WORKDIR /app
COPY serving ./serving
RUN python -m compileall -q serving && useradd --system --uid 10001 --no-create-home serving
USER serving
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
# Inside the container the server must listen on all interfaces for -p to reach it; publish the port on the
# host's loopback (-p 127.0.0.1:8000:8000) or set SERVING_API_KEY. Extra options go after the image name.
# `docker stop` sends SIGTERM: in-flight requests finish (up to --graceful-timeout, 30 s; use docker stop -t 35).
ENTRYPOINT ["python", "-m", "serving", "/artifact", "--host", "0.0.0.0", "--port", "8000"]
CMD []

# ---------------------------------------------------------------------------------------------------------------
FROM ${BASE} AS pipeline
ARG TORCH_INDEX=cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIPELINE_CACHE_DIR=/app/cache \
    PREFECT_HOME=/app/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# torch first, the lock's release from the PyTorch wheel index for the chosen device (PyPI's default build pulls
# CUDA packages); then the project at the lock's versions (requirements/lock.txt), as CI installs it.
COPY requirements ./requirements
RUN pip install -r requirements/torch-cpu.txt --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY flows ./flows
COPY export ./export
COPY serving ./serving
RUN pip install -c requirements/lock.txt . && pipeline --help >/dev/null
ENTRYPOINT ["pipeline"]
CMD ["deploy", "--method", "mlp_fusion", "--task", "sst2"]
