"""SMP's verbalizer head: MLM-head logits of the label words as a sequence classifier that reloads and exports."""

import pytest
import torch

from export.onnx import export_onnx, optimize_onnx
from pipeline.compress.methods.smp.verbalizer import (
    LABEL_WORDS,
    build_verbalizer_classifier,
    has_mlm_head,
    install_verbalizer_,
    label_word_ids,
)
from pipeline.data.encoding import encode
from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import SEQUENCE, TASKS, get_task
from pipeline.errors import PipelineError
from pipeline.train.metrics import predict_logits
from pipeline.train.parity import compare_logits, onnx_logits
from tests.helpers import save_pickled, tiny_model, tiny_tokenizer, write_tiny_model_dir

FAMILIES = ["bert", "roberta"]
# Single tokens in both tiny tokenizers' 400-token vocabularies ("great", "terrible", "yes" are split there).
WORDS = {kind: ["story", "film", "about"] for kind in FAMILIES}


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """Tiny `*ForMaskedLM` folders, and the in-memory models they were saved from.

    The head's LayerNorm and output bias are randomised: their initial 1/0 values would hide a dropped weight.
    """
    root = tmp_path_factory.mktemp("mlm")
    out = {}
    for kind in FAMILIES:
        model = tiny_model(kind, masked_lm=True)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith(("cls.", "lm_head.")):
                    p.add_(0.2 * torch.randn_like(p))
        model.save_pretrained(root / kind)
        tiny_tokenizer(kind).save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


def _batch(kind: str, pair: bool) -> dict[str, torch.Tensor]:
    texts = [t for (t,) in load_task_data("sst2", source="sample", max_dev=6).dev.texts]
    columns = (texts, texts[::-1]) if pair else (texts,)
    batch = tiny_tokenizer(kind)(*columns, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # the batch really is padded
    return dict(batch)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", ["sst2", "mnli"])
def test_logits_are_the_mlm_logits_of_the_label_words_at_the_first_token(family, task, mlm):
    path, reference = mlm[family]
    spec = TASKS[task]
    words = WORDS[family][: spec.num_labels]
    model = build_verbalizer_classifier(path, spec, words)
    ids = label_word_ids(tiny_tokenizer(family), words, family)
    batch = _batch(family, pair=spec.is_pair)
    with torch.no_grad():
        expected = reference(**batch).logits[:, 0, ids]
        got = model(**batch).logits
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert type(model).__name__.endswith("ForSequenceClassification")
    assert model.config.classifier_head == "verbalizer" and model.config.label_words == words
    assert model.config.id2label == dict(enumerate(spec.labels))


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_verbalizer_reloads_strictly_after_install(family, mlm, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model = build_verbalizer_classifier(mlm[family][0], get_task("sst2"), WORDS[family][:2])
    model.save_pretrained(tmp_path)
    tiny_tokenizer(family).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.classifier_head == "verbalizer"
    with pytest.raises(RuntimeError, match="LayerNorm"):  # the stock head cannot take these weights
        AutoModelForSequenceClassification.from_config(config).load_state_dict(state, strict=True)
    rebuilt = AutoModelForSequenceClassification.from_config(config)
    install_verbalizer_(rebuilt)
    rebuilt.load_state_dict(state, strict=True)
    batch = _batch(family, pair=False)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(**batch).logits, model(**batch).logits, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_export_matches_torch(family, mlm, tmp_path):
    model = build_verbalizer_classifier(mlm[family][0], get_task("sst2"), WORDS[family][:2])
    tokenizer = tiny_tokenizer(family)
    raw = export_onnx(model, tokenizer, tmp_path / "raw")
    optimize_onnx(raw, tmp_path / "model.onnx")
    enc = encode(tokenizer, load_task_data("sst2", source="sample", max_dev=32).dev, 64)
    ref = predict_logits(model, enc)
    for graph in (raw, tmp_path / "model.onnx"):
        parity = compare_logits(ref, onnx_logits(graph, enc, batch_size=8), atol=1e-4)
        assert parity.passed, (graph.name, parity)


@pytest.mark.parametrize("family", FAMILIES)
def test_has_mlm_head(family, mlm, tmp_path):
    assert has_mlm_head(mlm[family][0])
    save_pickled(mlm[family][1], tmp_path / "bin")
    assert not has_mlm_head(tmp_path / "bin")  # pickle weights are never read, not even for their names
    classifier = write_tiny_model_dir(tmp_path / "clf", family)
    assert not has_mlm_head(classifier)
    assert not has_mlm_head(write_tiny_model_dir(tmp_path / "bare", family, classifier=False))
    with pytest.raises(PipelineError, match="no pre-trained MLM head"):
        build_verbalizer_classifier(classifier, get_task("sst2"), WORDS[family][:2])


@pytest.mark.parametrize(("kind", "word"), [("bert", "unfunnyfilm"), ("bert", "☃"), ("roberta", "unfunnyfilm")])
def test_label_word_that_is_not_one_token_fails_on_one_line(kind, word):
    with pytest.raises(PipelineError) as err:
        label_word_ids(tiny_tokenizer(kind), ["film", word], kind)
    assert word in str(err.value) and "\n" not in str(err.value)


def test_default_label_words_follow_each_task_label_order():
    assert set(LABEL_WORDS) == {name for name, spec in TASKS.items() if spec.kind == SEQUENCE}
    for name, words in LABEL_WORDS.items():
        assert len(words) == TASKS[name].num_labels, name
    pairs = {name: dict(zip(TASKS[name].labels, words, strict=True)) for name, words in LABEL_WORDS.items()}
    assert pairs["sst2"] == {"negative": "terrible", "positive": "great"}
    assert pairs["mrpc"] == {"not_equivalent": "No", "equivalent": "Yes"}
    assert pairs["rte"] == pairs["qnli"] == {"entailment": "Yes", "not_entailment": "No"}
    assert pairs["mnli"] == {"entailment": "Yes", "neutral": "Maybe", "contradiction": "No"}
