"""serving.spans decodes answers and entities exactly as transformers' pipelines do: the same windows, answers
(text, start, end, score) and entity groups, on tiny random BERT and RoBERTa models over the Rust tokenizer."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoModelForTokenClassification, pipeline

from serving.spans import best_answers, entity_groups, question_windows, windowing
from tests.helpers import needs_qa_pipeline, sample_sentences, tiny_model, tiny_tokenizer

TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def _heads(kind: str, auto, seed: int, **config):
    torch.manual_seed(seed)
    cfg = tiny_model(kind).config
    for key, value in config.items():
        setattr(cfg, key, value)
    return auto.from_config(cfg).eval()


def _torch_logits(model, enc) -> tuple[np.ndarray, ...]:
    inputs = {"input_ids": torch.tensor([enc.ids]), "attention_mask": torch.tensor([enc.attention_mask])}
    if model.config.model_type == "bert":
        inputs["token_type_ids"] = torch.tensor([enc.type_ids])
    with torch.no_grad():
        out = model(**inputs)
    if hasattr(out, "start_logits"):
        return out.start_logits[0].numpy(), out.end_logits[0].numpy()
    return (out.logits[0].numpy(),)


@needs_qa_pipeline
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_answers_equal_the_question_answering_pipelines(family):
    tok = tiny_tokenizer(family)
    sentences = sample_sentences("dev")
    qa = pipeline("question-answering", model=_heads(family, AutoModelForQuestionAnswering, 0), tokenizer=tok)
    multi = 0
    settings = ((64, 16, 15), (128, 32, 30))  # max_seq_len, doc_stride, max_answer_len
    cutters = [windowing(tok.backend_tokenizer, max_len, stride) for max_len, stride, _ in settings]
    for n in range(12):
        question = " ".join(sentences[n].split()[:6]) + "?"
        context = " ".join(sentences[20 + 3 * n : 23 + 3 * n + n % 4])
        for (max_len, stride, answer_len), cutter in zip(settings, cutters, strict=True):
            windows = question_windows(cutter, question, context, tok.cls_token_id)
            multi += len(windows) > 1
            logits = [_torch_logits(qa.model, w.encoding) for w in windows]
            ours = best_answers(windows, [s for s, _ in logits], [e for _, e in logits], context, answer_len, top_k=3)
            theirs = qa(question=question, context=context, max_seq_len=max_len, doc_stride=stride,
                        max_answer_len=answer_len, top_k=3)  # fmt: skip
            assert [(a["answer"], a["start"], a["end"]) for a in ours] == [
                (a["answer"], a["start"], a["end"]) for a in theirs
            ]
            assert [a["score"] for a in ours] == pytest.approx([a["score"] for a in theirs], rel=1e-5)
    assert multi >= 4  # long contexts were windowed


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_entities_equal_the_token_classification_pipelines_simple_aggregation(family):
    tok = tiny_tokenizer(family)
    labels = {i: t for i, t in enumerate(TAGS)}
    model = _heads(family, AutoModelForTokenClassification, 1, num_labels=len(TAGS), id2label=labels,
                   label2id={t: i for i, t in labels.items()})  # fmt: skip
    ner = pipeline("token-classification", model=model, tokenizer=tok, aggregation_strategy="simple")
    found = 0
    for text in sample_sentences("dev")[:40]:
        enc = tok.backend_tokenizer.encode(text)
        ours = entity_groups(tok.backend_tokenizer, text, enc, _torch_logits(model, enc)[0], TAGS, tok.unk_token_id)
        theirs = ner(text)
        found += len(theirs)
        assert [(g["entity_group"], g["word"], g["start"], g["end"]) for g in ours] == [
            (g["entity_group"], g["word"], g["start"], g["end"]) for g in theirs
        ]
        assert [g["score"] for g in ours] == pytest.approx([float(g["score"]) for g in theirs], rel=1e-5)
    assert found > 40  # a random model tags plenty: the comparison is not over empty lists
