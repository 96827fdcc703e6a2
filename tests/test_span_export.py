"""Token-classification and question-answering models export like classifiers: every graph output (logits; start
and end logits) matches torch, ORT fuses the encoder and int8 runs. (Optimum's ORTModelForTokenClassification and
ORTModelForQuestionAnswering take such a folder as it is and answer as torch does: tests/consumer/.)"""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoModelForTokenClassification

from export.onnx import export_optimized
from tests.helpers import sample_sentences, tiny_model, tiny_tokenizer

TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
KINDS = {"token-classification": AutoModelForTokenClassification, "question-answering": AutoModelForQuestionAnswering}


def _model(family: str, kind: str):
    torch.manual_seed(0)
    cfg = tiny_model(family).config
    if kind == "token-classification":
        cfg.num_labels, cfg.id2label = len(TAGS), dict(enumerate(TAGS))
        cfg.label2id = {t: i for i, t in enumerate(TAGS)}
    return KINDS[kind].from_config(cfg).eval()


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_output_of_the_graph_matches_torch(family, kind, tmp_path):
    tok, model = tiny_tokenizer(family), _model(family, kind)
    info = export_optimized(model, tok, tmp_path)
    assert info["fused_ops"].get("Attention") == 2 and info["int8_ops"]["MatMulInteger"] > 0
    texts = sample_sentences()[:6]
    enc = tok(texts[:3], texts[3:], padding=True, return_tensors="np")
    with torch.no_grad():
        expected = model(**{k: torch.tensor(v) for k, v in enc.items()})
    for graph in ("model.onnx", "model.int8.onnx"):
        session = ort.InferenceSession(str(tmp_path / graph))
        feed = {i.name: enc[i.name] for i in session.get_inputs()}
        for out, value in zip(session.get_outputs(), session.run(None, feed), strict=True):
            diff = float(np.abs(value - getattr(expected, out.name).numpy()).max())
            assert diff <= (1e-4 if graph == "model.onnx" else 0.5), (graph, out.name, diff)


@pytest.mark.parametrize("kind", list(KINDS))
def test_torch_and_onnx_rows_agree_and_score_what_the_server_would_answer(kind, tmp_path):
    from pipeline.data.encoding import encode
    from pipeline.kinds.squad import QASplit, Question
    from pipeline.kinds.squad_metric import squad_scores, token_f1
    from pipeline.kinds.tagged import TaggedSplit
    from pipeline.train.metrics import example_scores, predict_logits, scores
    from pipeline.train.parity import compare_logits, onnx_logits
    from serving.spans import MAX_ANSWER_LEN, best_answers, question_windows, windowing

    tok, model = tiny_tokenizer("bert"), _model("bert", kind)
    export_optimized(model, tok, tmp_path)
    texts = sample_sentences()[:24]
    if kind == "token-classification":
        words = [tuple(t.split()) for t in texts]
        tags = [tuple([1, 2] + [0] * (len(w) - 3) + [5])[: len(w)] for w in words]  # a person first, a place last
        split = TaggedSplit(words, tags, tuple(TAGS))
        enc = encode(tok, split, 16)  # some sentences lose words to truncation: they are predicted O
    else:
        split = QASplit([Question(str(i), " ".join(texts[i].split()[:4]) + "?", " ".join(texts[i : i + 6]),
                                  ((texts[i].split()[0], 0),)) for i in range(12)])  # fmt: skip
        enc = encode(tok, split, 48, stride=16)
        assert len(enc) > len(split)  # windows
    torch_rows, onnx_rows = predict_logits(model, enc), onnx_logits(tmp_path / "model.onnx", enc)
    parity = compare_logits(torch_rows, onnx_rows, 1e-4)
    assert parity.passed, parity
    assert scores(torch_rows, enc) == scores(onnx_rows, enc)
    if kind == "token-classification":  # rows that put each word's gold tag on its first sub-token score 100
        full = encode(tok, split, 64)
        perfect, start = np.full((sum(len(f["input_ids"]) for f in full.features), len(TAGS)), -10.0), 0
        for feature, labels in zip(full.features, full.labels, strict=True):
            for n, label in enumerate(labels):
                perfect[start + n, max(label, 0)] = 10.0
            start += len(feature["input_ids"])
        assert scores(perfect, full) == {"precision": 100.0, "recall": 100.0, "f1": 100.0}
        assert example_scores(perfect, full) is None  # entity F1 counts the whole split, not examples
        return
    per_question = example_scores(torch_rows, enc)  # what int8_modes' paired differences average
    served = []  # what the server does: its own windows, the model per window, the same decoder
    cutter = windowing(tok.backend_tokenizer, 48, 16)
    for q in split.questions:
        windows = question_windows(cutter, q.question, q.context, tok.cls_token_id)
        outs = []
        for w in windows:
            with torch.no_grad():
                e = w.encoding
                out = model(input_ids=torch.tensor([e.ids]), token_type_ids=torch.tensor([e.type_ids]),
                            attention_mask=torch.tensor([e.attention_mask]))  # fmt: skip
            outs.append((out.start_logits[0].numpy(), out.end_logits[0].numpy()))
        answers = best_answers(windows, [s for s, _ in outs], [e for _, e in outs], q.context, MAX_ANSWER_LEN)
        served.append(answers[0])
    golds = [[a for a, _ in q.answers] for q in split.questions]
    texts = [a["answer"] for a in served]
    assert scores(torch_rows, enc) == pytest.approx(squad_scores(texts, golds))
    each = [100 * max(token_f1(a, g) for g in gs) for a, gs in zip(texts, golds, strict=True)]
    assert per_question.tolist() == pytest.approx(each)
    # every other question's gold answer made the served one: those score 100 each, in their place
    hit = QASplit([Question(q.id, q.question, q.context, ((a["answer"], a["start"]),) if i % 2 else q.answers)
                   for i, (q, a) in enumerate(zip(split.questions, served, strict=True))])  # fmt: skip
    hits = example_scores(onnx_rows, encode(tok, hit, 48, stride=16))
    assert hits[1::2].tolist() == [100.0] * 6 and hits[::2].tolist() == pytest.approx(each[::2])


def test_example_scores_of_a_sequence_task_are_each_examples_accuracy():
    from pipeline.kinds.base import Encoded
    from pipeline.train.metrics import example_scores, scores

    enc = Encoded(features=[{"input_ids": [1, 2]}] * 4, labels=[0, 1, 1, 0], pad_id=0)
    rows = np.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5], [1.0, 0.0]])
    assert example_scores(rows, enc).tolist() == [100.0, 100.0, 0.0, 100.0]
    assert scores(rows, enc)["accuracy"] == 75.0
