"""The sentence-embedding kind's data and metrics: the STS benchmark's scored pairs and SQuAD retrieval on the real
shared files, a user's pairs and query-document lists, the metrics against scipy and hand-worked cases, the
pooling a model folder names, and the embedder's save and reload."""

import json

import numpy as np
import pytest
import torch

from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.kinds.embedding_metric import pair_scores, ranks, relevant_ranks, retrieval_scores
from pipeline.kinds.retrieval import read_retrieval
from tests.helpers import SHARED_DATA, tiny_model


def test_spearman_and_pearson_agree_with_scipy_ties_included():
    from scipy import stats

    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(200, 8)), rng.normal(size=(200, 8))
    gold = rng.integers(0, 6, size=200).astype(float)  # STS-B's scores tie often
    cosine = (first * second).sum(-1) / np.linalg.norm(first, axis=-1) / np.linalg.norm(second, axis=-1)
    got = pair_scores(first, second, list(gold))
    assert got["spearman"] == pytest.approx(100 * stats.spearmanr(cosine, gold).statistic, abs=1e-9)
    assert got["pearson"] == pytest.approx(100 * stats.pearsonr(cosine, gold).statistic, abs=1e-9)
    assert list(ranks(np.array([3.0, 1.0, 3.0, 2.0]))) == [3.5, 1.0, 3.5, 2.0]


def test_retrieval_ranks_recall_and_ndcg_by_hand():
    docs = np.eye(3)
    queries = np.array([[1.0, 0.1, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
    rank = relevant_ranks(queries, docs, [0, 0, 1])
    # first: its document first; second: doc 2 above it and doc 1 tied with it; third: tied with doc 0
    assert list(rank) == [1, 3, 2]  # a tie counts against the relevant document
    got = retrieval_scores(rank)
    assert got["recall_at_1"] == pytest.approx(100 / 3)
    assert got["recall_at_10"] == 100
    assert got["ndcg_at_10"] == pytest.approx(100 * (1 + 1 / np.log2(4) + 1 / np.log2(3)) / 3)
    assert retrieval_scores(np.array([11]))["ndcg_at_10"] == 0.0


def test_stsb_real_pairs_load_with_a_validation_slice_of_train():
    data = load_task_data(get_task("stsb"), SHARED_DATA / "stsb")
    # training pairs that share a sentence with a validation pair are dropped (STS-B's sentences recur)
    assert (len(data.train), len(data.validation), len(data.dev)) == (5749 - 574 - 253, 574, 1500)
    assert data.describe()["validation_split"]["dropped_from_train"] == 253
    assert data.dev.pairs[0] == ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.")
    assert data.dev.scores[0] == 5.0 and min(data.train.scores) >= 0 and max(data.train.scores) <= 5
    assert not {t for p in data.validation.pairs for t in p} & {t for p in data.train.pairs for t in p}


def test_squad_retrieval_carves_whole_articles_and_searches_each_splits_own_paragraphs():
    data = load_task_data(get_task("squad-retrieval"), SHARED_DATA / "squad")
    assert len(data.dev) == 1025 and len(data.dev.documents) == 211  # the 6 dev articles' paragraphs
    train_groups, val_groups = set(data.train.groups.values()), set(data.validation.groups.values())
    assert not train_groups & val_groups and not set(data.train.documents) & set(data.validation.documents)
    assert len(data.train) + len(data.validation) == 4671
    assert 467 <= len(data.validation) <= 2 * 467 or len(val_groups) == 1
    for split in (data.train, data.validation, data.dev):
        assert all(doc in split.documents for doc in split.relevant)


def test_a_users_query_document_lines_group_and_refuse_in_one_line(tmp_path):
    file = tmp_path / "q.jsonl"
    rows = [{"query": "q1", "document": "d1", "group": "a"}, {"query": "q2", "document": "d2", "group": "a"},
            {"query": "q3", "document": "d1", "group": "a"}, {"query": "q4", "document": "d3"}]  # fmt: skip
    file.write_text("\n".join(map(json.dumps, rows)))
    split = read_retrieval(file)
    assert list(split.documents) == ["d1", "d2", "d3"] and split.relevant_rows() == [0, 1, 0, 2]
    part = split.subset([3])
    assert list(part.documents) == ["d3"]  # a document without a group is its own
    assert list(split.subset([1]).documents) == ["d1", "d2"]  # every document of the query's group
    file.write_text(json.dumps({"query": "q1", "document": "d1", "group": "a"}) + "\n"
                    + json.dumps({"query": "q2", "document": "d1", "group": "b"}))  # fmt: skip
    with pytest.raises(PipelineError, match=r"q.jsonl:2: the document is in group 'a' already, not 'b'"):
        read_retrieval(file)
    file.write_text(json.dumps({"query": "q1"}))
    with pytest.raises(PipelineError, match=r"q.jsonl:1: missing column\(s\) document"):
        read_retrieval(file)


def test_a_pair_with_a_score_that_is_not_a_number_is_named(tmp_path):
    from pipeline.kinds.scored_pairs import read_pairs

    file = tmp_path / "pairs.tsv"
    file.write_text("sentence1\tsentence2\tscore\na\tb\t4.5\nc\td\thigh\n")
    with pytest.raises(PipelineError, match=r"pairs.tsv:3: score is a str \('high'\); expected a number"):
        read_pairs(get_task("stsb"), file)


def test_pooling_comes_from_the_folder_and_an_unsupported_one_is_refused(tmp_path):
    from pipeline.models.embedding import folder_pooling

    (tmp_path / "config.json").write_text("{}")
    assert folder_pooling(tmp_path) == "mean"  # a plain encoder: mean, as sentence-transformers wraps one
    pooling = tmp_path / "1_Pooling"
    pooling.mkdir()
    (pooling / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert folder_pooling(tmp_path) == "cls"
    (pooling / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(PipelineError, match="pooling pooling_mode_max_tokens; this pipeline pools by one of"):
        folder_pooling(tmp_path)


@pytest.mark.parametrize("projection", [None, 48])
def test_the_embedder_saves_and_reloads_exactly_with_its_pooling_and_projection(tmp_path, projection):
    from pipeline.models.embedding import SentenceEmbedder
    from pipeline.models.io import load_model, save_model

    config = tiny_model("bert").config
    config.sentence_projection = projection
    torch.manual_seed(0)
    model = SentenceEmbedder.from_config(config, pooling="cls").eval()
    ids = torch.randint(5, 300, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    out = model(input_ids=ids, attention_mask=mask)
    assert out.sentence_embedding.shape == (3, projection or 32)
    assert torch.allclose(out.sentence_embedding.norm(dim=-1), torch.ones(3))
    save_model(model, None, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["BertModel"] and saved["sentence_pooling"] == "cls"
    again = load_model(tmp_path)
    assert isinstance(again, SentenceEmbedder) and again.pooling == "cls"
    assert torch.equal(again(input_ids=ids, attention_mask=mask).sentence_embedding, out.sentence_embedding)


def test_a_users_embedding_task_files_load_and_a_classifier_metric_is_kept_to_its_kind(tmp_path):
    from pipeline.data.tasks import load_task_file, task_spec

    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps({"a": f"t{i}", "b": f"u{i}", "s": i % 5}) for i in range(8))
    )
    (tmp_path / "dev.jsonl").write_text(json.dumps({"a": "x", "b": "y", "s": 1.5}))
    file = tmp_path / "pairs.yaml"
    file.write_text("name: mine\nkind: sentence-embedding\ntrain: train.jsonl\ndev: dev.jsonl\n"
                    "text_columns: [a, b]\nlabel_column: s\n")  # fmt: skip
    task = load_task_file(file)
    assert task.metric == "spearman"
    data = load_task_data(task_spec(task.name, task))
    assert data.dev.scores == [1.5] and len(data.train) + len(data.validation) + data.dropped_from_train == 8
    lines = [{"query": f"q{i}", "document": f"d{i // 2}"} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(map(json.dumps, lines)))
    (tmp_path / "dev.jsonl").write_text(json.dumps({"query": "q", "document": "d"}))
    file.write_text(
        "name: search\nkind: sentence-embedding\ntrain: train.jsonl\ndev: dev.jsonl\nmetric: recall_at_10\n"
    )
    data = load_task_data(task_spec("search", load_task_file(file)))
    assert len(data.dev) == 1 and list(data.dev.documents) == ["d"]
    file.write_text("name: c\ntrain: train.jsonl\ndev: dev.jsonl\ntext_columns: [query]\nlabel_column: document\n"
                    "labels: [d0, d1]\nmetric: spearman\n")  # fmt: skip
    with pytest.raises(
        PipelineError, match="a classification task is scored by accuracy, f1 or macro_f1, not spearman"
    ):
        load_task_file(file)


def test_a_base_folder_becomes_an_embedder_with_its_own_pooling_and_its_encoders_weights(tmp_path):
    """A plain encoder folder (as sentence-transformers ships one, `1_Pooling` beside it) loads as the embedding
    task's model: the folder's weights, its pooling, no pooler."""
    from transformers import AutoModel

    from pipeline.models.embedding import SentenceEmbedder
    from pipeline.models.io import load_base_model
    from tests.helpers import write_tiny_model_dir

    folder = write_tiny_model_dir(tmp_path / "base", classifier=False)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    model = load_base_model(folder, get_task("stsb")).eval()
    assert isinstance(model, SentenceEmbedder) and model.pooling == "cls" and model.projection is None
    assert not any(name.startswith("bert.pooler") for name in model.state_dict())
    encoder = AutoModel.from_pretrained(str(folder)).eval()
    ids = torch.randint(5, 300, (2, 7))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        first = encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        got = model(input_ids=ids, attention_mask=mask).sentence_embedding
    assert torch.allclose(got, torch.nn.functional.normalize(first, dim=-1), atol=1e-6)
