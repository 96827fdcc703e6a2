"""Retrieval for sentence embeddings: queries, each with one relevant document in a pool of documents, scored by
where the relevant one ranks among all of the split's documents by cosine similarity.

Built from SQuAD JSON (`.json`: each question a query, the paragraph it was asked on its relevant document, the
pool every paragraph of the split's articles) or from JSONL (`.jsonl`: one `query` and its relevant `document`
per line, an optional `group`; the pool is every distinct document of the split).

A document belongs to a group (a SQuAD article; a JSONL line's `group`, else the document alone). A subset of the
queries keeps the documents of their groups, so a validation split carved by whole groups
(`pipeline.kinds.embedding`) searches its own articles' paragraphs, none of which training saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.errors import PipelineError
from pipeline.jsonfile import parse_json
from pipeline.kinds.records import describe, json_records, nonblank_text
from pipeline.paths import read_utf8
from serving.artifact import EMBEDDING


@dataclass(frozen=True)
class RetrievalSplit:
    """Queries of one split: `relevant[i]` is the id of query i's document; `documents` the pool (id: text, in file
    order); `groups` each document's group."""

    queries: list[str]
    relevant: list[str]
    documents: dict[str, str]
    groups: dict[str, str]
    kind: ClassVar[str] = EMBEDDING

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, idx: Sequence[int]) -> RetrievalSplit:
        """Queries `idx`, with every document of their groups."""
        kept = {self.groups[self.relevant[i]] for i in idx}
        docs = {d: text for d, text in self.documents.items() if self.groups[d] in kept}
        return RetrievalSplit([self.queries[i] for i in idx], [self.relevant[i] for i in idx], docs,
                              {d: self.groups[d] for d in docs})  # fmt: skip

    def head(self, n: int | None) -> RetrievalSplit:
        return self.subset(range(len(self) if n is None else min(n, len(self))))

    def query_groups(self) -> list[str]:
        return [self.groups[d] for d in self.relevant]

    @property
    def texts(self) -> list[str]:
        """The queries, then the documents: what one encoded feature each is made of."""
        return [*self.queries, *self.documents.values()]

    def relevant_rows(self) -> list[int]:
        """Each query's document as its place in `documents`."""
        place = {d: i for i, d in enumerate(self.documents)}
        return [place[d] for d in self.relevant]

    def digest(self, h) -> None:
        for query, doc in zip(self.queries, self.relevant, strict=True):
            h.update(f"{query}\x1f{doc}\n".encode())
        for doc, text in self.documents.items():
            h.update(f"{doc}\x1f{self.groups[doc]}\x1f{text}\n".encode())
        h.update(b"\x1d")


def retrieval_rows(rows: Iterable[tuple[str, str, str, str | None]], source: object) -> RetrievalSplit:
    """A split from (where, query, document, group) rows; a document's id is its text, its group the row's (the
    document itself when None). A document named in two groups is an error: it could not be in one split alone."""
    queries, relevant, documents, groups = [], [], {}, {}
    for where, query, document, group in rows:
        queries.append(nonblank_text(query, f"{where}: query"))
        doc = nonblank_text(document, f"{where}: document")
        group = doc if group is None else group
        if groups.setdefault(doc, group) != group:
            raise PipelineError(f"{where}: the document is in group {groups[doc]!r} already, not {group!r}")
        documents.setdefault(doc, doc)
        relevant.append(doc)
    if not queries:
        raise PipelineError(f"{source}: no queries")
    return RetrievalSplit(queries, relevant, documents, groups)


def _from_squad_json(path: Path, text: str) -> RetrievalSplit:
    doc = parse_json(text, str(path))
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise PipelineError(f"{path}: expected SQuAD JSON, an object whose 'data' is a list of articles")
    rows = []
    for a, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise PipelineError(f"{path}: data[{a}].paragraphs must be a list of paragraphs")
        title = article.get("title")
        group = title if isinstance(title, str) and title else f"data[{a}]"
        for p, paragraph in enumerate(paragraphs):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise PipelineError(f"{where} must be an object with 'context' and a list 'qas'")
            context = nonblank_text(paragraph.get("context"), f"{where}.context")
            for i, qa in enumerate(paragraph["qas"]):
                question = qa.get("question") if isinstance(qa, dict) else qa
                rows.append((f"{where}.qas[{i}]", question, context, group))
    return retrieval_rows(rows, path)


def read_retrieval(path: Path) -> RetrievalSplit:
    """The queries and documents of a SQuAD JSON (`.json`) or query-document JSONL (`.jsonl`) file."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl"):
        raise PipelineError(f"{path}: unknown format {path.suffix!r}; retrieval files are .json or .jsonl")
    text = read_utf8(path, "data file")
    if suffix == ".json":
        return _from_squad_json(path, text)
    rows = []
    for n, obj in json_records(path, text.splitlines(), ("query", "document")):
        group = obj.get("group")
        if group is not None and not isinstance(group, str | int):
            raise PipelineError(f"{path}:{n}: group is {describe(group)}; expected a string")
        rows.append((f"{path}:{n}", obj["query"], obj["document"], None if group is None else str(group)))
    return retrieval_rows(rows, path)
