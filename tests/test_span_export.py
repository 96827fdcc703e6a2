"""Token-classification and question-answering models export like classifiers: every graph output (logits; start
and end logits) matches torch, ORT fuses the encoder, int8 runs, and Optimum's ORTModelForTokenClassification and
ORTModelForQuestionAnswering take the folder as it is, answering through transformers' pipelines as torch does."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoModelForTokenClassification, pipeline

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
def test_every_output_of_the_graph_matches_torch_and_optimum_answers_alike(family, kind, tmp_path):
    from optimum.onnxruntime import ORTModelForQuestionAnswering, ORTModelForTokenClassification

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

    ort_class = ORTModelForTokenClassification if kind == "token-classification" else ORTModelForQuestionAnswering
    served = pipeline(kind, model=ort_class.from_pretrained(tmp_path), tokenizer=tok)
    reference = pipeline(kind, model=model, tokenizer=tok)
    if kind == "question-answering":
        for q, c in zip(texts[:3], texts[3:], strict=True):
            question = " ".join(q.split()[:5]) + "?"
            a, b = served(question=question, context=c), reference(question=question, context=c)
            assert (a["answer"], a["start"], a["end"]) == (b["answer"], b["start"], b["end"])
    else:
        for text in texts:
            a, b = served(text), reference(text)
            assert [(e["entity"], e["start"], e["end"]) for e in a] == [(e["entity"], e["start"], e["end"]) for e in b]
