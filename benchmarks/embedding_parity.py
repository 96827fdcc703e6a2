"""A sentence-embedding artifact's vectors against sentence-transformers, on real sentences: the artifact's graphs as
the server runs them (`ArtifactSession`, fp32 and int8), the same folder loaded by `SentenceTransformer(dir,
backend="onnx")` (its own tokenisation and pooling in torch over `last_hidden_state`), and the base model as
sentence-transformers runs it in torch (`--base`: the original the artifact was made from; for `--method none` the
vectors must be the same). Prints the least and mean cosine of each pair, per text.

    python benchmarks/embedding_parity.py ARTIFACT --texts ../shared/data/stsb/dev.tsv [--base MODEL_DIR] [--n 500]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def sentences(path: Path, n: int) -> list[str]:
    """The first `n` distinct sentences of a GLUE-style TSV's sentence1 and sentence2 columns."""
    seen: dict[str, None] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            for column in ("sentence1", "sentence2"):
                if row.get(column):
                    seen.setdefault(row[column], None)
    return list(seen)[:n]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--texts", type=Path, required=True)
    parser.add_argument("--base", type=Path, help="the base model folder (sentence-transformers layout)")
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    from serving.session import ArtifactSession

    texts = sentences(args.texts, args.n)
    vectors = {}
    for precision in ("fp32", "int8"):
        session = ArtifactSession(args.artifact, precision=precision, spinning=False)
        vectors[f"server {precision}"] = np.concatenate(
            [session.run(session.encode(texts[i : i + 32])) for i in range(0, len(texts), 32)]
        )
    for precision, graph in (("fp32", "onnx/model.onnx"), ("int8", "onnx/model_qint8_avx512_vnni.onnx")):
        options = {"file_name": graph}
        model = SentenceTransformer(str(args.artifact), backend="onnx", model_kwargs=options, device="cpu")
        vectors[f"sentence-transformers onnx {precision}"] = model.encode(texts, batch_size=32)
    if args.base is not None:
        vectors["sentence-transformers torch (base)"] = SentenceTransformer(str(args.base), device="cpu").encode(
            texts, batch_size=32
        )
    print(f"{len(texts)} sentences of {args.texts}")
    print("| vectors | against | least cosine | mean cosine |")
    print("|---|---|---|---|")
    pairs = [
        ("sentence-transformers onnx fp32", "server fp32"),
        ("sentence-transformers onnx int8", "server int8"),
        ("server int8", "server fp32"),
    ]
    if args.base is not None:
        pairs.append(("server fp32", "sentence-transformers torch (base)"))
    for a, b in pairs:
        c = cosines(vectors[a], vectors[b])
        print(f"| {a} | {b} | {c.min():.6f} | {c.mean():.6f} |")


if __name__ == "__main__":
    main()
