"""Token classification and question answering through the real command: `pipeline deploy` with a user's NER task
(JSONL) and QA task (SQuAD JSON) on a tiny BERT publishes an artifact whose compaction is exact, whose ONNX graph
matches torch on every output, that names its kind, and whose server answers as transformers' pipeline on the
compacted torch model does (Optimum's classes load such artifacts in tests/consumer/)."""

import json

import httpx
import pytest
from transformers import AutoTokenizer, pipeline

from pipeline.pareto import pareto_report
from tests.helpers import QA_PIPELINE, ServerProcess, quick_deploy, sample_sentences

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _ner_task(folder):
    rows = [{"tokens": s.split(), "tags": ["B-PER", "I-PER", *["O"] * (len(s.split()) - 3), "B-LOC"]}
            for s in sample_sentences("train") if len(s.split()) >= 3]  # fmt: skip
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:200]))
    (folder / "dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows[200:240]))
    path = folder / "people.yaml"
    path.write_text(f"name: people\nkind: token-classification\ntrain: train.jsonl\ndev: dev.jsonl\nlabels: {TAGS}\n")
    return path, len(rows[200:240])


def _qa_task(folder):
    def squad(sentences):  # each paragraph of three sentences asks for its first word
        def qa(i):
            return {"id": f"q{i}", "question": "what comes first?",
                    "answers": [{"text": sentences[i].split()[0], "answer_start": 0}]}  # fmt: skip

        paragraphs = [
            {"context": " ".join(sentences[i : i + 3]), "qas": [qa(i)]} for i in range(0, len(sentences) - 3, 3)
        ]
        return {"version": "1.1", "data": [{"title": "sample", "paragraphs": paragraphs}]}

    texts = sample_sentences("train")
    dev = squad(texts[600:720])
    (folder / "train.json").write_text(json.dumps(squad(texts[:600])))
    (folder / "dev.json").write_text(json.dumps(dev))
    path = folder / "first.yaml"
    path.write_text("name: first\nkind: question-answering\ntrain: train.json\ndev: dev.json\n")
    return path, len(dev["data"][0]["paragraphs"])


@pytest.mark.e2e
@pytest.mark.parametrize(("kind", "method"), [("token-classification", "gmp"), ("question-answering", "distill")])
def test_a_span_task_deploys_and_its_artifact_answers_alike_everywhere(kind, method, base_dirs, tmp_path):
    from pipeline.models.io import load_model

    task, dev_count = _ner_task(tmp_path) if kind == "token-classification" else _qa_task(tmp_path)
    # question answering runs at 384 tokens unless told otherwise (recipes/kinds/): this model has 160 positions
    extra = {
        "distill": ("--set", "config.student.layers=1", "--set", "config.transfer_steps=2", "--set",
                    "config.relation_heads=4", "--set", "teacher.max_length=128", "--set", "target.seq=128",
                    "--set", "config.train.max_length=128"),
        "gmp": ("--set", "config.prune_every=1", "--set", "config.train.cycles=3", "--steps", "6"),
    }[method]  # fmt: skip
    _, artifact = quick_deploy(method, base_dirs["bert"], tmp_path, "--steps", "4", *extra,
                               task=("--task-file", str(task)))  # fmt: skip
    report = json.loads((artifact / "report.json").read_text())
    assert report["compaction"]["max_abs_diff"] <= 1e-5 and report["validation"]["onnx_parity"]["passed"]
    assert report["validation"]["examples"]["dev"] == min(dev_count, 32)  # sentences or questions (--max-dev 32)
    dev = report["validation"]["metrics"]["dev"]["onnx_int8"]
    assert set(dev) == ({"precision", "recall", "f1"} if kind == "token-classification" else {"exact_match", "f1"})
    config = json.loads((artifact / "config.json").read_text())
    assert config["encoder_deploy_task"]["kind"] == kind and config["encoder_deploy_task"]["metric"] == "f1"
    front = pareto_report([("run", artifact)], [], max_metric_drop=100.0)  # a sweep's pick reads the kind's metric
    assert front["metric"] == "f1" and front["selected"] == str(artifact)
    assert [p["validation"] for p in front["points"] if p["artifact"]] == [report["validation"]["metrics"][
        "validation"]["onnx_int8"]["f1"]]  # fmt: skip
    assert config["encoder_deploy_task"]["max_length"] == 128  # trained at: the server's default

    if kind == "question-answering" and not QA_PIPELINE:
        return  # transformers 5 has no question-answering pipeline: tests/consumer/ compares with 4's
    tok = AutoTokenizer.from_pretrained(artifact)
    # transformers' pipeline on the artifact's torch model (Optimum's classes on the graph answer as it does:
    # tests/consumer/); the server, on the fp32 graph, answers as the pipeline
    reference = pipeline(kind, model=load_model(artifact / "pytorch"), tokenizer=tok)
    texts = sample_sentences("dev")[:8]
    with ServerProcess(artifact, log=tmp_path / "server.log") as server:
        for i, text in enumerate(texts[:3]):
            if kind == "token-classification":
                got = httpx.post(f"{server.url}/predict", json={"inputs": text}, timeout=60).json()
                want = reference(text, aggregation_strategy="simple")
                assert [(e["entity_group"], e["start"], e["end"]) for e in got] == [
                    (e["entity_group"], e["start"], e["end"]) for e in want
                ]
            else:
                item = {"question": "what comes first?", "context": " ".join(texts[i : i + 3])}
                got = httpx.post(f"{server.url}/predict", json={"inputs": item}, timeout=60).json()
                want = reference(**item, max_answer_len=30)
                assert (got["answer"], got["start"], got["end"]) == (want["answer"], want["start"], want["end"])
