"""sentence-transformers' own dynamic-int8 ONNX export of a dense model (`export_dynamic_quantized_onnx_model`, the
int8 graph its users get for free), written to one .onnx file for timing beside an artifact.

A sentence-embedding deploy's bench makes this graph itself where optimum-onnx is installed (`pip install -e
".[optimum]"`, which holds transformers at 4.57). On the lock's transformers 5 it cannot (optimum-onnx's releases so
far require transformers < 4.58), so make it in the consumer check's virtualenv and time it with the others:

    python -m venv .st && .st/bin/pip install -c requirements/consumer.txt -r requirements/consumer.in
    .st/bin/python benchmarks/st_int8_baseline.py MODEL_DIR ST_INT8.onnx
    python benchmarks/latency.py dense=DENSE/dense.onnx dense-int8=DENSE/dense.int8.onnx st-int8=ST_INT8.onnx \
        compressed-int8=ARTIFACT/model.int8.onnx --vocab-size V --passes 8

MODEL_DIR: the dense model in sentence-transformers' layout (the embedded all-MiniLM-L6-v2's folder, or the one
`pipeline base-model all-mpnet-base-v2` writes). The quantiser's config is the one it names for this CPU
(`avx512_vnni`, `avx512`, `avx2` or `arm64`), as `export.sentence_transformers.quantisation_config` picks it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="the dense model, sentence-transformers' layout")
    parser.add_argument("out", type=Path, help="the .onnx file to write")
    args = parser.parse_args()
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"st_int8_baseline: {args.model_dir} has no config.json: not a model folder")
    if args.out.suffix != ".onnx" or args.out.exists():
        sys.exit(f"st_int8_baseline: {args.out}: give a new path ending in .onnx")

    from export.sentence_transformers import dense_int8_baseline, st_onnx_missing

    missing = st_onnx_missing()
    if missing:
        sys.exit(f"st_int8_baseline: {missing}; run it in the virtualenv of requirements/consumer.txt")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    made = dense_int8_baseline(args.model_dir, args.out)
    print(json.dumps({**made, "out": str(args.out), "seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
