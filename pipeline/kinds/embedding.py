"""Sentence embeddings (semantic search, retrieval, deduplication): a text in, one vector out, scored either on
scored pairs (the STS benchmark: Spearman of the cosine similarity, `pipeline.kinds.scored_pairs`) or on retrieval
(queries against a pool of documents: recall@1, recall@10, nDCG@10, `pipeline.kinds.retrieval`); the task's metric
says which. Every text is one feature (a pair's two side by side; a retrieval split's queries, then its
documents), and a model's row per feature is its pooled, normalised embedding. There are no labels: a student
learns the teacher's embeddings (the teacher is the base model itself)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from export.sentence_transformers import ST_GRAPHS
from pipeline.errors import PipelineError
from pipeline.kinds.base import Encoded, Kind, Spec, whole_groups
from pipeline.kinds.embedding_metric import pair_scores, query_ndcg, relevant_ranks, retrieval_scores
from pipeline.kinds.records import ROW_FORMATS
from pipeline.kinds.retrieval import RetrievalSplit, read_retrieval, retrieval_rows
from pipeline.kinds.scored_pairs import PairSplit, pair_rows, read_pairs
from pipeline.kinds.sequence import encode_texts
from serving.artifact import EMBEDDING, GRAPHS

log = logging.getLogger(__name__)

PAIR_METRICS = ("spearman", "pearson")
RETRIEVAL_METRICS = ("ndcg_at_10", "recall_at_1", "recall_at_10")


def is_retrieval(spec: Spec) -> bool:
    """A retrieval task (queries and documents), not scored pairs: its metric says so."""
    return spec.metric in RETRIEVAL_METRICS


class SentenceEmbedding(Kind):
    name = EMBEDDING
    rows = "embedding"  # a pooled, normalised embedding per text
    formats: ClassVar[dict[str, str]] = {**ROW_FORMATS, ".json": "squad"}
    task_file_defaults: ClassVar[dict[str, Any]] = {
        "text_columns": ["sentence1", "sentence2"],
        "label_column": "score",
        "metric": "spearman",
    }
    folder_name = "sentence-embedding"
    fine_tunes_teacher = False
    vectors = True
    # vectors need recovery's 3,000 steps (STS-B at 4x: -3.30 -> -2.50); from 8x, fewer layers before less width
    # (STS-B at 8x, dev: -3.58 -> -2.55 on three seeds' mean, -1.73 with its recovery at 1e-4 for 6,000 steps)
    target_recipes = ((1.0, "embedding"), (8.0, "embedding-shallow"))
    hub_name = "Sentence Similarity"
    example = 'model.encode(["A man is playing a guitar.", "Someone plays an instrument."])'

    def check_task_file(self, task: Any) -> None:
        if task.labels:
            raise ValueError("labels: a sentence-embedding task has none (a student learns the teacher's vectors)")
        if task.scheme is not None:
            raise ValueError("scheme: IOB1/IOB2 is for token-classification tasks")
        if task.metric not in (*PAIR_METRICS, *RETRIEVAL_METRICS):
            known = ", ".join((*PAIR_METRICS, *RETRIEVAL_METRICS))
            raise ValueError(f"metric: a sentence-embedding task is scored by one of {known}, not {task.metric}")
        if task.metric in PAIR_METRICS and (len(task.text_columns) != 2 or not task.label_column):
            raise ValueError("text_columns: scored pairs name two text columns and a label_column with the score")

    def num_labels(self, spec: Spec) -> int:
        return 0  # no head: the width of a vector is the model's

    def inputs(self, spec: Spec) -> str:
        return "texts to embed"

    def predicts(self, spec: Spec) -> str:
        return "a vector per text"

    def card_description(self, task: dict) -> str:
        return "sentence-embedding model"

    def read(self, spec: Spec, path: Path) -> PairSplit | RetrievalSplit:
        if is_retrieval(spec):
            return read_retrieval(path)
        return read_pairs(spec, path)

    def hf_columns(self, spec: Spec) -> tuple[str, ...]:
        return spec.hf_text_columns if is_retrieval(spec) else (*spec.hf_text_columns, "label")

    def hf_split(self, spec: Spec, part: Any, where: str, part_name: str) -> PairSplit | RetrievalSplit:
        """Scored pairs: the two text columns and `label` (GLUE's stsb: the score); retrieval: a query and its
        document column (SQuAD's question and context, grouped by `title` where the split has it)."""
        split = f"{where}: split {part_name}"
        if is_retrieval(spec):
            query, document = spec.hf_text_columns
            titles = part["title"] if "title" in part.column_names else [None] * len(part)
            rows = zip(part[query], part[document], titles, strict=True)
            return retrieval_rows(((f"{split}, row {i}", q, d, t) for i, (q, d, t) in enumerate(rows)), split)
        first, second = spec.hf_text_columns
        rows = ({first: a, second: b, "label": s} for a, b, s in zip(part[first], part[second], part["label"],
                                                                         strict=True))  # fmt: skip
        return pair_rows(((f"{split}, row {i}", row) for i, row in enumerate(rows)), (first, second), "label", split)

    def validation_draw(self, split: PairSplit | RetrievalSplit, n: int, seed: int) -> set[int]:
        """Scored pairs: a random slice; retrieval: whole groups (a SQuAD article's questions together, so
        validation searches paragraphs training never saw), until there are n queries, at least one left; the first
        group is taken whatever its size."""
        if isinstance(split, PairSplit):
            return super().validation_draw(split, n, seed)
        return whole_groups(split.query_groups(), n, seed, most=2 * n)  # articles vary ten-fold in size

    def sharing_texts(self, split: PairSplit | RetrievalSplit, chosen: set[int]) -> set[int]:
        """Scored pairs: training pairs with a sentence of a validation pair (STS-B's sentences recur in several
        pairs; a student trained on a validation sentence would flatter validation). Retrieval is carved by whole
        groups already."""
        if isinstance(split, RetrievalSplit):
            return set()
        held = {text for i in chosen for text in split.pairs[i]}
        return {i for i, pair in enumerate(split.pairs) if i not in chosen and (pair[0] in held or pair[1] in held)}

    def holds(self, out: Any) -> bool:
        return hasattr(out, "sentence_embedding")

    def output_rows(self, out: Any, lengths: list[int]) -> list[np.ndarray]:
        return [row.numpy().copy() for row in out.sentence_embedding.float().cpu()]

    def assemble(self, rows: list[np.ndarray], width: int, device: Any) -> Any:
        import torch

        from pipeline.kinds.embedding_output import EmbeddingOutput

        return EmbeddingOutput(sentence_embedding=torch.stack([torch.from_numpy(r) for r in rows]).to(device))

    def card_usage(self, task: dict) -> list[str]:
        """sentence-transformers' ONNX backend on the int8 graph, and Text Embeddings Inference on the folder."""
        return [
            "```python",
            "from sentence_transformers import SentenceTransformer",
            "",
            f'int8 = {{"file_name": "{ST_GRAPHS[GRAPHS["int8"]]}"}}',
            'model = SentenceTransformer(".", backend="onnx", model_kwargs=int8)',
            f'# on a GPU: model_kwargs={{"file_name": "{ST_GRAPHS[GRAPHS["fp16"]]}"}}, device="cuda"',
            self.example,
            "```",
            "",
            "Text Embeddings Inference serves the folder as it is (`text-embeddings-router --model-id .`, ONNX "
            f"backend: the root `{GRAPHS['fp32']}`, its `sentence_embedding` output).",
        ]

    def baseline_graphs(self, model_dir: str, work: Path, cache_dir: str) -> dict:
        """sentence-transformers' own dynamic-int8 export of the dense model (`export.sentence_transformers`), made
        once per teacher and library versions (a minute for MiniLM-L6, several for a 12 x 768 model). Its ONNX
        export runs through optimum-onnx, which requires transformers < 4.58: where that is not installed the
        baseline is not timed, and the report says why."""
        import shutil

        from export.onnx import library_versions
        from export.sentence_transformers import dense_int8_baseline, st_onnx_missing

        missing = st_onnx_missing()
        if missing:
            log.warning("sentence-transformers' own int8 baseline not timed: %s", missing)
            return {"dense-int8-st": {"skipped": missing}}
        from pipeline.cache import cached_stage, dir_digest
        from pipeline.staging import ST_DENSE_INT8

        versions = library_versions(("sentence-transformers", "optimum-onnx", "onnxruntime", "onnx", "torch"))
        key = {"stage": "st-dense-int8", "v": "1", "teacher": dir_digest(Path(model_dir)), "versions": versions}
        entry, hit, report = cached_stage(cache_dir, "dense_onnx", key, lambda out: dense_int8_baseline(
            model_dir, out / ST_DENSE_INT8))  # fmt: skip
        shutil.copy2(entry / ST_DENSE_INT8, work / ST_DENSE_INT8)  # a copy: the run never touches the cache entry
        return {"dense-int8-st": {**report, "cached": hit}}

    def write_layout(self, folder: Path, model: Any, max_length: int) -> list[str]:
        """sentence-transformers' files and its names for the graphs (`export.sentence_transformers`)."""
        from export.onnx import library_versions
        from export.sentence_transformers import write_layout

        found = library_versions(("sentence-transformers", "transformers", "torch"))
        versions = {"sentence_transformers": found.get("sentence-transformers", "unknown"),
                    "transformers": found["transformers"], "pytorch": found["torch"]}  # fmt: skip
        return write_layout(folder, model.width, model.pooling, max_length, versions)

    def encode(self, tokenizer: Any, split: PairSplit | RetrievalSplit, max_length: int,
               stride: int | None = None) -> Encoded:  # fmt: skip
        texts = split.texts
        enc = encode_texts(tokenizer, [texts], [None] * len(texts), max_length)
        return Encoded(enc.features, enc.labels, enc.pad_id, EMBEDDING, split)

    def scores(self, rows: np.ndarray, enc: Encoded) -> dict[str, float]:
        split = enc.source
        if isinstance(split, PairSplit):
            return pair_scores(rows[0::2], rows[1::2], split.scores)
        return retrieval_scores(self._ranks(rows, split))

    def mixed_scores(self, rows: np.ndarray, reference: np.ndarray, enc: Encoded) -> dict[str, float]:
        """Retrieval: `rows`' queries searched against `reference`'s documents (an index built with the teacher,
        queried by the student); scored pairs: each pair's first sentence from `rows`, its second from
        `reference`."""
        split = enc.source
        if isinstance(split, PairSplit):
            return pair_scores(rows[0::2], reference[1::2], split.scores)
        return retrieval_scores(self._ranks(rows, split, reference))

    def example_scores(self, rows: np.ndarray, enc: Encoded) -> np.ndarray | None:
        """Retrieval: each query's nDCG@10; a correlation over pairs has no per-example share (None)."""
        if isinstance(enc.source, PairSplit):
            return None
        return query_ndcg(self._ranks(rows, enc.source))

    @staticmethod
    def _ranks(rows: np.ndarray, split: RetrievalSplit, documents: np.ndarray | None = None) -> np.ndarray:
        """Each query's relevant rank, its query from `rows` and the documents from `documents`' rows (default:
        `rows`' own)."""
        n = len(split.queries)
        documents = rows if documents is None else documents
        for r in (rows, documents):
            if len(r) != n + len(split.documents):
                raise PipelineError(f"{len(r)} embedding rows for {n} queries and {len(split.documents)} documents")
        return relevant_ranks(rows[:n], documents[n:], split.relevant_rows())
