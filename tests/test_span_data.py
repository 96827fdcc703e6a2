"""Token-classification and question-answering data and metrics: the CoNLL and SQuAD readers on the real files in
`../shared/data` and on every kind of bad file, the entity metric against `seqeval`, and SQuAD's exact match and
F1 against hand-worked cases of the official normalisation."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from seqeval.metrics import f1_score, precision_score, recall_score

from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import load_task_file, task_spec
from pipeline.errors import PipelineError
from pipeline.kinds.entity_metric import entities, entity_scores
from pipeline.kinds.squad import QASplit, read_qa
from pipeline.kinds.squad_metric import normalize_answer, squad_scores, token_f1
from pipeline.kinds.tagged import TaggedSplit, check_tag_set, read_conll, read_tagged_jsonl, to_iob2
from tests.helpers import SHARED_DATA

CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is not beside the checkout")


# --- SQuAD v1.1 exact match and F1 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("The Denver Broncos", "denver broncos"),  # lower case, the article goes
        ("  an  apple a day ", "apple day"),  # a / an / the as words, whitespace collapsed
        ("theater Anaheim", "theater anaheim"),  # articles inside words stay
        ("U.S. $1,000-odd!", "us 1000odd"),  # punctuation is deleted, not replaced by a space
        ("The", ""),
        ("(the) A.", ""),  # punctuation first, so the bracketed article is a word by the time articles go
        ("Ça l’été", "ça l’été"),  # only ASCII punctuation (string.punctuation) is removed
    ],
)
def test_normalisation_is_the_official_scripts(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match_and_f1_take_the_best_gold_answer():
    # "Denver Broncos team" vs "Denver Broncos": 2 shared tokens, precision 2/3, recall 1, F1 0.8
    assert token_f1("Denver Broncos team", "the Denver Broncos") == pytest.approx(0.8)
    assert token_f1("Broncos Broncos", "Broncos") == pytest.approx(2 * 0.5 * 1 / 1.5)  # bags count repeats once
    assert token_f1("the", "a") == 0.0  # both normalise to nothing: no shared token
    scores = squad_scores(
        ["Denver Broncos", "Denver Broncos team", "Carolina"],
        [["the Denver Broncos", "Broncos"], ["Denver Broncos", "Denver Broncos team!"], ["Panthers"]],
    )
    assert scores == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}
    assert squad_scores(["Broncos"], [["Denver Broncos", "the Broncos"]])["f1"] == 100.0


# --- entity-level F1 against seqeval ---------------------------------------------------------------------------


def test_entities_follow_the_conll_rules():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-ORG", "B-ORG", "I-ORG"]
    assert entities(tags) == [("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("ORG", 6, 6), ("ORG", 7, 8)]


def test_entity_scores_equal_seqevals_on_random_and_broken_sequences():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 12)
        gold = [[rng.choice(CONLL_TAGS) for _ in range(rng.randint(1, 15))] for _ in range(n)]
        pred = [[t if rng.random() < 0.7 else rng.choice(CONLL_TAGS) for t in g] for g in gold]
        ours = entity_scores(pred, gold)
        assert ours["precision"] == pytest.approx(100 * precision_score(gold, pred))
        assert ours["recall"] == pytest.approx(100 * recall_score(gold, pred))
        assert ours["f1"] == pytest.approx(100 * f1_score(gold, pred))


@needs_shared
def test_entity_scores_equal_seqevals_on_conll_dev():
    dev = read_conll(SHARED_DATA / "conll2003" / "dev.txt", CONLL_TAGS)
    gold = [[CONLL_TAGS[t] for t in tags] for tags in dev.tags]
    rng = random.Random(1)
    pred = [[t if rng.random() < 0.9 else rng.choice(CONLL_TAGS) for t in g] for g in gold]
    assert entity_scores(pred, gold)["f1"] == pytest.approx(100 * f1_score(gold, pred))
    assert entity_scores(gold, gold)["f1"] == 100.0


# --- CoNLL and JSONL tagged files ------------------------------------------------------------------------------


@needs_shared
def test_conll2003_reads_as_its_readme_counts():
    train = read_conll(SHARED_DATA / "conll2003" / "train.txt", CONLL_TAGS)
    assert len(train) == 14_041 and sum(map(len, train.words)) == 203_621
    found = Counter(kind for tags in train.tags for kind, _, _ in entities([CONLL_TAGS[t] for t in tags]))
    assert found == {"PER": 6_600, "LOC": 7_140, "ORG": 6_321, "MISC": 3_438}
    dev = read_conll(SHARED_DATA / "conll2003" / "dev.txt", CONLL_TAGS)
    assert len(dev) == 3_250 and sum(map(len, dev.words)) == 51_362


def test_iob1_files_become_their_iob2_conversion(tmp_path):
    assert to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC",
                                                                           "B-ORG"]  # fmt: skip
    path = tmp_path / "iob1.txt"
    path.write_text("-DOCSTART- -X- O\n\nPeter NNP I-PER\nBlackburn NNP I-PER\nand CC O\nBonn NNP I-LOC\n\n\n")
    split = read_conll(path, CONLL_TAGS)
    assert split.words == [("Peter", "Blackburn", "and", "Bonn")]
    assert [CONLL_TAGS[t] for t in split.tags[0]] == ["B-PER", "I-PER", "O", "B-LOC"]


def _documents(path: Path, docs: int, per_doc: int, marked: bool = True) -> None:
    """A CoNLL file of `docs` documents of `per_doc` sentences each; a document's sentences name its own person."""
    lines = []
    for d in range(docs):
        lines += ["-DOCSTART- -X- O", ""] if marked else []
        lines += [line for k in range(per_doc) for line in (f"Person{d} NNP B-PER", f"said{k} VBD O", "")]
    path.write_text("\n".join(lines) + "\n")


def test_a_file_of_documents_is_carved_by_whole_documents_by_default(tmp_path, caplog):
    """`auto` draws whole documents where the CoNLL file marks them, so no validation sentence's document (its
    people and places) is trained on; a file without `-DOCSTART-` keeps the random slice, exactly as before."""
    from pipeline.config.schema import DataLimits
    from pipeline.data.loaders import DataRef, carve_validation
    from pipeline.stages.data import run as data_stage

    _documents(tmp_path / "train.conll", docs=40, per_doc=10)
    _documents(tmp_path / "dev.conll", docs=2, per_doc=3)
    body = "name: people\nkind: token-classification\ntrain: train.conll\ndev: dev.conll\nlabels: [O, B-PER, I-PER]\n"
    spec = task_spec("people", load_task_file(_task_file(tmp_path, body)))
    train = read_conll(tmp_path / "train.conll", spec.labels)
    assert train.documents == tuple(1 + i // 10 for i in range(400)) and train.subset([0, 15]).documents == (1, 2)
    default = DataLimits().validation
    data = load_task_data(spec, validation=default)
    assert data.validation_unit == "document" and len(data.validation) == 100  # a quarter of 400, by tens
    held, kept = set(data.validation.documents), set(data.train.documents)
    assert len(held) == 10 and not held & kept and len(held | kept) == 40
    assert data.describe()["validation_split"]["chosen"] == "auto: the training file marks 40 documents"
    asked = load_task_data(spec, validation=(*default[:3], "document"))
    assert asked.fingerprint == data.fingerprint and asked.auto_chose is None
    with caplog.at_level("INFO", logger="pipeline.stages.data"):
        data_stage(DataRef(spec, "files"))
    assert "validation holds out whole documents (data.validation_unit auto)" in caplog.text

    _documents(tmp_path / "train.conll", docs=40, per_doc=10, marked=False)
    clean = load_task_data(spec, validation=default)
    example = load_task_data(spec, validation=(*default[:3], "example"))
    assert clean.validation_unit == "example" and clean.train.documents == ()
    assert clean.fingerprint == example.fingerprint and clean.describe() == example.describe()
    with pytest.raises(PipelineError, match=r"validation_unit=document is for token tasks whose files mark"):
        carve_validation(clean.train, 10, 0.1, 0, "document")


def test_jsonl_takes_tag_names_or_ids(tmp_path):
    path = tmp_path / "ner.jsonl"
    rows = [{"tokens": ["EU", "rejects", "German"], "ner_tags": [3, 0, 7]},
            {"tokens": ["Peter", "Blackburn"], "ner_tags": ["B-PER", "I-PER"]}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    split = read_tagged_jsonl(path, "tokens", "ner_tags", CONLL_TAGS)
    assert split.tags == [(3, 0, 7), (1, 2)]


@pytest.mark.parametrize(
    ("name", "body", "needle"),
    [
        ("bad.txt", "EU NNP B-ORG\nrejects VBZ B-VERB\n", "bad.txt:2: tag 'B-VERB' is not in the task's tag set"),
        ("bad.txt", "EU NNP B-ORG\nrejects\n", "bad.txt:2: expected a word and its tag"),
        ("bad.txt", "-DOCSTART- -X- O\n\n", "bad.txt: no sentences"),
        ("bad.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', "bad.jsonl:1: 'tags' must list one tag per word (2)"),
        ("bad.jsonl", '{"tokens": [], "tags": []}\n', "bad.jsonl:1: 'tokens' must be a non-empty list"),
        ("bad.jsonl", '\n{"tokens": ["a"], "tags": [9]}\n', "bad.jsonl:2: tags 9 is not in the task's tag set"),
        ("bad.jsonl", '{"words": ["a"], "tags": ["O"]}\n', "bad.jsonl:1: missing column(s) tokens"),
    ],
)
def test_a_bad_tagged_file_is_one_line_naming_file_line_and_field(tmp_path, name, body, needle):
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(PipelineError) as e:
        read_conll(path, CONLL_TAGS) if name.endswith(".txt") else read_tagged_jsonl(
            path, "tokens", "tags", CONLL_TAGS
        )
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("tags", "needle"),
    [
        (["B-PER", "I-PER"], "need 'O'"),
        (["O", "B-PER"], "missing I-PER"),
        (["O", "PER"], "is not O, B-TYPE or I-TYPE"),
        (["O", "O"], "each tag once"),
    ],
)
def test_a_tag_set_the_model_cannot_predict_iob2_with_is_refused(tags, needle):
    with pytest.raises(ValueError, match=needle):
        check_tag_set(tags)
    check_tag_set(CONLL_TAGS)


# --- SQuAD JSON and JSONL --------------------------------------------------------------------------------------


@needs_shared
def test_the_squad_files_read_as_their_readme_counts():
    train, dev = read_qa(SHARED_DATA / "squad" / "train.json"), read_qa(SHARED_DATA / "squad" / "dev.json")
    assert (len(train), len(dev)) == (4_671, 1_025)
    q = train.questions[0]
    assert q.context[q.answers[0][1] :].startswith(q.answers[0][0])


def _squad(context="Denver won.", answers=({"text": "Denver", "answer_start": 0},), qid="q1", question="Who won?"):
    qa = {"id": qid, "question": question, "answers": list(answers)}
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [qa]}]}]}


def test_jsonl_questions_take_either_answer_layout(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": "a", "question": "Who?", "context": "Denver won.", "answers": {"text": ["won"], "answer_start": [7]}},
        {"id": "b", "question": "Who?", "context": "Denver won.", "answers": [{"text": "Denver", "answer_start": 0}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [q.answers for q in read_qa(path).questions] == [(("won", 7),), (("Denver", 0),)]


def test_a_squad_file_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(PipelineError, match=r"deep\.json: not valid JSON here \(nested too deeply\)"):
        read_qa(path)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_squad(answers=[{"text": "Denver", "answer_start": 3}]),
         "data[0].paragraphs[0].qas[0] (id q1): answer 'Denver' is not at offset 3 of its context (there: 'ver wo')"),
        (_squad(context="  "), "data[0].paragraphs[0].context is empty"),
        (_squad(answers=[]), "(id q1): no answers"),
        (_squad(question=""), "(id q1): question is empty"),
        (_squad(answers=[{"text": "Denver", "answer_start": -1}]), "answer_start is -1; expected an offset"),
        ({"data": {}}, "expected SQuAD JSON"),
        (_squad(context="Denver won. " * 2100), "context has 25,200 characters; at most 25,000 (split the document"),
    ],
)  # fmt: skip
def test_a_bad_squad_file_is_one_line_naming_file_question_and_field(tmp_path, doc, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PipelineError) as e:
        read_qa(path)
    assert needle in str(e.value) and str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_a_bad_jsonl_question_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"id": "a", "question": "Who?", "context": "Denver won.", "answers": [{"text": "won", "answer_start": 7}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "context": ""}) + "\n")
    with pytest.raises(PipelineError, match=r"bad.jsonl:2: context is empty"):
        read_qa(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(PipelineError, match="question id 'a' appears twice"):
        read_qa(path)


# --- the built-in tasks: loaded like any other -------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize(("task", "split_type"), [("conll2003", TaggedSplit), ("squad", QASplit)])
def test_the_built_in_token_and_qa_tasks_load_with_a_validation_split_carved_from_train(task, split_type):
    folder = SHARED_DATA / task
    data = load_task_data(task, folder)
    assert isinstance(data.train, split_type) and isinstance(data.dev, split_type)
    total = len(read_qa(folder / "train.json")) if task == "squad" else 14_041
    assert len(data.train) + len(data.validation) == total and len(data.validation) >= 250
    assert data.fingerprint == load_task_data(task, folder).fingerprint  # deterministic: a cache key
    assert data.describe()["source"].startswith("data folder")
    if task == "squad":  # carved by whole contexts: no validation question's paragraph is trained on
        assert not {q.context for q in data.train.questions} & {q.context for q in data.validation.questions}
    else:  # carved by whole documents (`auto`: the file marks 946): no validation document is trained on
        assert data.validation_unit == "document" and data.describe()["validation_split"]["documents"] > 50
        assert not set(data.train.documents) & set(data.validation.documents)
    capped = load_task_data(task, folder, max_train=100, max_dev=50)
    assert (len(capped.train), len(capped.dev)) == (100, 50) and capped.validation == data.validation


def _hf_rows(split) -> dict:
    """A split as the Hugging Face dataset's columns: CoNLL's words and tag ids, SQuAD's rows."""
    if isinstance(split, TaggedSplit):
        return {"id": [str(i) for i in range(len(split))], "tokens": [list(w) for w in split.words],
                "ner_tags": [list(t) for t in split.tags]}  # fmt: skip
    qs = split.questions
    answers = [{"text": [a for a, _ in q.answers], "answer_start": [s for _, s in q.answers]} for q in qs]
    return {"id": [q.id for q in qs], "title": ["t"] * len(qs), "context": [q.context for q in qs],
            "question": [q.question for q in qs], "answers": answers}  # fmt: skip


def _write_files(split, path: Path) -> None:
    """A split in the task's own file format: CoNLL columns, or SQuAD JSON (one paragraph per question)."""
    if isinstance(split, TaggedSplit):
        sentences = ["\n".join(f"{w} {split.names[t]}" for w, t in zip(ws, ts, strict=True))
                     for ws, ts in zip(split.words, split.tags, strict=True)]  # fmt: skip
        path.write_text("\n\n".join(sentences) + "\n")
        return

    def qa(q):
        return {"id": q.id, "question": q.question, "answers": [{"text": a, "answer_start": s} for a, s in q.answers]}

    paragraphs = [{"context": q.context, "qas": [qa(q)]} for q in split.questions]
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))


@needs_shared
@pytest.mark.parametrize("task", ["conll2003", "squad"])
def test_a_local_hugging_face_dataset_of_a_token_or_qa_task_reads_as_its_files(task, tmp_path):
    """`--data-dir` with the dataset's parquet export (train, validation) gives the examples its files give (the
    first 600 training and 200 dev examples of the real files, written both ways)."""
    from datasets import Dataset

    from pipeline.data.loaders import read_split

    spec = task_spec(task)
    hf, files = tmp_path / "hf", tmp_path / "files"
    hf.mkdir(), files.mkdir()
    parts = {"train": (spec.train_file, 600), "validation": (spec.dev_file, 200)}
    splits = {n: read_split(spec, SHARED_DATA / task / f).head(k) for n, (f, k) in parts.items()}
    for name, split in splits.items():
        Dataset.from_dict(_hf_rows(split)).to_parquet(str(hf / f"{name}-00000-of-00001.parquet"))
        _write_files(split, files / parts[name][0])
    data, reference = load_task_data(task, hf), load_task_data(task, files)
    assert (data.train, data.validation, data.dev) == (reference.train, reference.validation, reference.dev)
    assert len(data.dev) == 200 and "Hugging Face dataset" in data.describe()["source"]
    broken = _hf_rows(splits["validation"])
    if task == "conll2003":
        broken["ner_tags"][3][0], needle = 9, "split validation, row 3: ner_tags 9 is not in the task's tag set"
    else:
        broken["answers"][3]["answer_start"][0] += 1
        needle = "split validation, row 3: answer"
    Dataset.from_dict(broken).to_parquet(str(hf / "validation-00000-of-00001.parquet"))
    with pytest.raises(PipelineError, match=needle):
        load_task_data(task, hf)


# --- a user's token-classification and question-answering tasks (--task-file) ---------------------------------


def _task_file(folder: Path, body: str) -> Path:
    path = folder / "task.yaml"
    path.write_text(body)
    return path


def test_a_users_ner_and_qa_task_files_load(tmp_path):
    (tmp_path / "train.conll").write_text("Peter NNP I-PER\nBlackburn NNP I-PER\n\n" * 12 + "Bonn NNP I-LOC\n\n" * 8)
    (tmp_path / "dev.jsonl").write_text(json.dumps({"tokens": ["Bonn"], "tags": ["B-LOC"]}) + "\n")
    ner = _task_file(tmp_path, "name: people\nkind: token-classification\ntrain: train.conll\ndev: dev.jsonl\n"
                               "labels: [O, B-PER, I-PER, B-LOC, I-LOC]\nscheme: IOB1\n")  # fmt: skip
    spec = task_spec("people", load_task_file(ner))
    assert (spec.kind, spec.labels, spec.metric, spec.text_columns) == (
        "token-classification",
        ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"),
        "f1",
        ("tokens",),
    )
    data = load_task_data(spec)
    assert data.dev.tags == [(3,)] and len(data.train) + len(data.validation) == 20
    assert data.train.tags[0] in ((1, 2), (3,))  # IOB1 read as IOB2

    rows = [{"id": str(i), "question": "Who won?", "context": f"Team {i} won.", "answers": [
        {"text": f"Team {i}", "answer_start": 0}]} for i in range(12)]  # fmt: skip
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    qa = _task_file(tmp_path, "name: wins\nkind: question-answering\ntrain: qa.jsonl\ndev: qa.jsonl\n")
    spec = task_spec("wins", load_task_file(qa))
    assert (spec.kind, spec.labels, spec.metric, spec.num_labels) == ("question-answering", (), "f1", 2)
    assert len(load_task_data(spec).dev) == 12


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("kind: token-classification\ntrain: a.conll\ndev: b.conll\nlabels: [O, B-PER]\n", "labels: the tags need "
         "both B- and I- of every entity type; missing I-PER"),
        ("kind: token-classification\ntrain: a.conll\ndev: b.conll\nlabels: [O, B-X, I-X]\nmetric: accuracy\n",
         "metric: a token-classification task is scored by f1, not accuracy"),
        ("kind: token-classification\ntrain: a.conll\ndev: b.conll\n", "labels: give the tag set in id order"),
        ("kind: token-classification\ntrain: a.tsv\ndev: b.conll\nlabels: [O, B-X, I-X]\n",
         "a.tsv': the format comes from the extension, one of .txt, .conll, .jsonl"),
        ("kind: question-answering\ntrain: a.json\ndev: b.json\nlabels: [yes, no]\n", "labels: a question-answering "
         "task has none"),
        ("kind: question-answering\ntrain: a.csv\ndev: b.json\n", "one of .json, .jsonl"),
        ("kind: sequence-classification\ntrain: a.tsv\ndev: b.tsv\ntext_columns: [t]\nlabel_column: l\n"
         "labels: [a, b]\nscheme: IOB2\n", "scheme: IOB1/IOB2 is for token-classification tasks"),
        ("kind: regression\ntrain: a.tsv\ndev: b.tsv\n",
         "kind: unknown task kind 'regression'; one of sequence-classification"),
    ],
)  # fmt: skip
def test_a_bad_ner_or_qa_task_file_is_one_line(tmp_path, body, needle):
    with pytest.raises(PipelineError) as e:
        load_task_file(_task_file(tmp_path, "name: mine\n" + body))
    assert needle in str(e.value) and "\n" not in str(e.value)


# --- encoding and the loss rows of every kind ------------------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_words_tag_labels_its_first_sub_token_only(family):
    from pipeline.data.encoding import collate, encode
    from pipeline.kinds.base import IGNORED
    from tests.helpers import tiny_tokenizer

    tok = tiny_tokenizer(family)
    split = TaggedSplit([("Blackburn", "rejects", "it", "."), ("Bonn",)], [(1, 0, 0, 0), (5,)], CONLL_TAGS)
    enc = encode(tok, split, 32)
    for i, (words, tags) in enumerate(zip(split.words, split.tags, strict=True)):
        firsts = [n for n, label in enumerate(enc.labels[i]) if label != IGNORED]
        assert [enc.labels[i][n] for n in firsts] == list(tags) and len(firsts) == len(words)
        text = " ".join(words)  # as the sentence is served
        offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
        starts = [text.index(w, sum(len(x) + 1 for x in words[:k])) for k, w in enumerate(words)]
        assert [offsets[n][0] for n in firsts] == starts  # each word's first token starts the word
        assert enc.labels[i][0] == IGNORED and enc.labels[i][-1] == IGNORED  # the special tokens
    batch = collate(enc, [0, 1])
    assert batch["labels"].shape == batch["input_ids"].shape and batch["labels"][1, -1] == IGNORED  # pads


@needs_shared
def test_question_windows_are_labelled_with_their_answers_tokens():
    from pipeline.data.encoding import encode
    from tests.helpers import tiny_tokenizer

    tok = tiny_tokenizer("bert")
    questions = read_qa(SHARED_DATA / "squad" / "dev.json").head(40)
    enc = encode(tok, questions, 96, stride=32)
    pairs = [q.question for q in questions.questions], [q.context for q in questions.questions]
    ref = tok(*pairs, max_length=96, truncation="only_second", stride=32, return_overflowing_tokens=True,
              return_offsets_mapping=True)  # fmt: skip
    assert len(enc) == len(ref["input_ids"]) > 2 * len(questions)  # long contexts: several windows each
    found = set()
    for i, (s, e) in enumerate(enc.labels):
        q = questions.questions[ref["overflow_to_sample_mapping"][i]]
        text, start = q.answers[0]
        offsets, in_context = ref["offset_mapping"][i], [n for n, k in enumerate(ref.sequence_ids(i)) if k == 1]
        inside = offsets[in_context[0]][0] <= start and start + len(text) <= offsets[in_context[-1]][1]
        if not inside:
            assert (s, e) == (0, 0)
            continue
        found.add(q.id)  # the first token holds the answer's first character, the last its last one
        assert offsets[s][0] <= start < offsets[s][1] and offsets[e][0] < start + len(text) <= offsets[e][1]
    assert len(found) == len(questions)  # every question's answer lies in at least one window


def test_a_question_leaving_no_room_for_its_context_is_one_line():
    from pipeline.data.encoding import encode
    from pipeline.kinds.squad import Question
    from tests.helpers import tiny_tokenizer

    q = Question("q1", "who " * 40, "Denver won.", (("Denver", 0),))
    with pytest.raises(PipelineError, match=r"question q1 leaves \d+ tokens of 48 for its context, not more than"):
        encode(tiny_tokenizer("bert"), QASplit([q]), 48, stride=16)


@pytest.mark.parametrize("kind", ["token", "qa"])
def test_loss_rows_score_real_tokens_only_and_kd_to_itself_is_zero(kind):
    import torch

    from pipeline.config.schema import TrainConfig
    from pipeline.data.encoding import collate, encode
    from pipeline.train.losses import classification_loss, prediction_rows
    from tests.helpers import tiny_span_case, tiny_tokenizer

    tok = tiny_tokenizer("bert")
    model, split = tiny_span_case(kind)
    enc = encode(tok, split, 64, stride=16)
    alone = [classification_loss(None, TrainConfig())(model, collate(enc, [i])) for i in range(len(enc))]
    batch = collate(enc, list(range(len(enc))))
    together = classification_loss(None, TrainConfig())(model, batch)
    rows, _ = prediction_rows(model(**{k: v for k, v in batch.items() if k != "labels"}), batch)
    if kind == "qa":  # a start and an end row per window; padded positions cannot be chosen
        assert rows.shape[0] == 2 * len(enc) and (rows[1, batch["attention_mask"][1] == 0] <= -1e4).all()
        assert together.item() == pytest.approx(sum(a.item() for a in alone) / len(alone), rel=1e-5)
    else:  # one row per real token: padding the short sentence changes nothing
        assert rows.shape[0] == int(batch["attention_mask"].sum())
        scored = [int((torch.tensor(enc.labels[i]) != -100).sum()) for i in range(len(enc))]
        mean = sum(a.item() * n for a, n in zip(alone, scored, strict=True)) / sum(scored)
        assert together.item() == pytest.approx(mean, rel=1e-5)
    kd = classification_loss(model, TrainConfig(kd_alpha=1.0))(model, batch)
    assert kd.item() == pytest.approx(0.0, abs=1e-6)


# --- heads of every kind: built from a base model, compacted, saved and reloaded at per-layer shapes -----------


@pytest.mark.parametrize("family", ["bert", "distilbert", "modernbert", "mpnet"])
def test_token_and_qa_heads_load_compact_exactly_and_reload(family, tmp_path):
    import torch

    from pipeline.compress.compaction import compact_
    from pipeline.data.tasks import get_task
    from pipeline.models.families import family_of
    from pipeline.models.io import load_base_model, load_model, save_model
    from pipeline.models.layers import encoder_layers, ffn_widths, head_counts
    from tests.helpers import tiny_family_model, tiny_family_tokenizer

    torch.manual_seed(0)
    base = tmp_path / "base"
    tiny_family_model(family).base_model.save_pretrained(base)  # a bare encoder, as on the hub
    tiny_family_tokenizer(family).save_pretrained(base)
    ids = torch.randint(5, 300, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    for task in ("conll2003", "squad"):
        spec = get_task(task)
        model = load_base_model(base, spec).eval()
        adapter, blocks = family_of(model), encoder_layers(model)
        with torch.no_grad():  # layer 0 loses head 0, layer 1 five neurons: two layers of their own shapes
            d = adapter.head_size(blocks[0])
            blocks[0].get_submodule(adapter.head_writer.path).weight[:, :d] = 0
            blocks[1].get_submodule(adapter.ffn_writer.path).weight[:, :5] = 0

        def outputs(m):
            with torch.no_grad():
                out = m(input_ids=ids, attention_mask=mask)
            names = ("logits", "start_logits", "end_logits")
            return [getattr(out, k) for k in names if getattr(out, k, None) is not None]

        before = outputs(model)
        assert [o.shape for o in before] == ([(3, 10, 9)] if task == "conll2003" else [(3, 10), (3, 10)])
        compact_(model)
        assert head_counts(model)[:2] == [2, 3] and ffn_widths(model)[:2] == [40, 35]
        for a, b in zip(before, outputs(model), strict=True):
            assert torch.allclose(a, b, atol=1e-5)  # compaction is exact for these heads too
        again = load_model(save_model(model, None, tmp_path / task))
        assert head_counts(again) == head_counts(model) and type(again) is type(model)
        for a, b in zip(outputs(model), outputs(again), strict=True):
            assert torch.equal(a, b)
