"""Sentence-embedding metrics, as the STS benchmark and retrieval benchmarks (MTEB, BEIR) compute them: Spearman's
and Pearson's correlation between cosine similarity and the gold score of each pair; recall@1, recall@10 and
nDCG@10 of each query's one relevant document among all documents. All in percent."""

from __future__ import annotations

import numpy as np


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (an all-zero row stays zero), in float64 so ranks do not tie by rounding."""
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank (what Spearman's correlation needs)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    ranked = np.empty(len(values))
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranked[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranked


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64) - np.mean(a), np.asarray(b, dtype=np.float64) - np.mean(b)
    denominator = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0


def pair_scores(first: np.ndarray, second: np.ndarray, gold: list[float]) -> dict[str, float]:
    """Spearman and Pearson (x 100) of the pairs' cosine similarities against `gold`."""
    cosine = (unit_rows(first) * unit_rows(second)).sum(-1)
    return {"spearman": 100 * pearson(ranks(cosine), ranks(gold)), "pearson": 100 * pearson(cosine, gold)}


RECALL_AT = (1, 10)
NDCG_AT = 10


def relevant_ranks(queries: np.ndarray, documents: np.ndarray, relevant: list[int]) -> np.ndarray:
    """Each query's relevant document's rank (1: first) among all documents by cosine similarity; a tie with
    another document counts against it (the rank is the worst the tie allows)."""
    sims = unit_rows(queries) @ unit_rows(documents).T
    own = sims[np.arange(len(relevant)), relevant]
    return (sims >= own[:, None]).sum(-1)


def query_ndcg(rank: np.ndarray) -> np.ndarray:
    """nDCG@10 of each query with one relevant document: 1 / log2(rank + 1) within the first ten, else 0 (x 100)."""
    return np.where(rank <= NDCG_AT, 100 / np.log2(rank + 1.0), 0.0)


def retrieval_scores(rank: np.ndarray) -> dict[str, float]:
    """Recall@k (the share of queries whose document ranks within k) and nDCG@10, from `relevant_ranks`."""
    scores = {f"recall_at_{k}": float(100 * (rank <= k).mean()) for k in RECALL_AT}
    scores[f"ndcg_at_{NDCG_AT}"] = float(query_ndcg(rank).mean())
    return scores
