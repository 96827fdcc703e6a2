# The pipeline image: runs `pipeline deploy` (CPU by default; CUDA base image as a build argument).
#   docker build -t encoder-deploy .
#   docker run --rm -v "$PWD/artifacts:/app/artifacts" -v "$PWD/data:/data:ro" encoder-deploy \
#       deploy --method mlp_fusion --task sst2 --data-dir /data/sst2
# GPU:  docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg TORCH_INDEX=cu128 -t encoder-deploy:gpu .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_INDEX=cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIPELINE_CACHE_DIR=/app/cache \
    PREFECT_HOME=/app/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# torch first, from the PyTorch wheel index for the chosen device (PyPI's default build pulls CUDA packages).
RUN pip install "torch==2.13.0" --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY flows ./flows
COPY export ./export
COPY serving ./serving
RUN pip install . && pipeline --help >/dev/null
ENTRYPOINT ["pipeline"]
CMD ["deploy", "--method", "mlp_fusion", "--task", "sst2"]
