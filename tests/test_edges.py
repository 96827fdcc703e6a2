"""The edges of a run: a compacted model as the base, devices, named data sources, report artifacts."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.compress.compaction import compact_
from pipeline.data.loaders import load_task_data, resolve_source
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.io import load_base_model, save_model
from pipeline.models.layers import encoder_layers, ffn_widths, head_counts
from tests.helpers import (
    LOOSE_GATES,
    assert_one_line_error,
    cli_deploy,
    quick_args,
    sample_logits,
    tiny_model,
    tiny_tokenizer,
)


@pytest.fixture()
def compacted_dir(tmp_path):
    """A tiny classifier with one head and half the FFN of layer 0 removed, saved at its per-layer shapes."""
    model = tiny_model("bert", heads=4)
    layer = encoder_layers(model)[0]
    with torch.no_grad():
        layer.output.dense.weight[:, :32] = 0  # 32 of 64 neurons write nothing
        layer.attention.output.dense.weight[:, :8] = 0  # head 0 (size 8) writes nothing
    compact_(model)
    save_model(model, tiny_tokenizer("bert"), tmp_path / "compacted")
    return model, tmp_path / "compacted"


def test_a_compacted_model_is_a_usable_base(compacted_dir):
    """Every shrunk layer loads as saved (it used to come back full width with random weights)."""
    model, folder = compacted_dir
    assert ffn_widths(model) == [32, 64] and head_counts(model) == [3, 4]
    same_task = load_base_model(folder, get_task("sst2")).eval()
    assert ffn_widths(same_task) == [32, 64] and head_counts(same_task) == [3, 4]
    assert torch.equal(sample_logits(same_task), sample_logits(model))  # same label count: the head is kept
    assert same_task.config.id2label == {0: "negative", 1: "positive"}
    other = load_base_model(folder, get_task("mnli")).eval()  # three labels: only the head is new
    assert other.classifier.out_features == 3 and ffn_widths(other) == [32, 64]
    for a, b in zip(encoder_layers(other), encoder_layers(model), strict=True):
        assert torch.equal(a.intermediate.dense.weight, b.intermediate.dense.weight)


def _new_head(folder, task: str, seed: int, noise: int) -> dict:
    torch.manual_seed(noise)  # another process state: how many numbers were drawn before
    torch.rand(noise)
    model = load_base_model(folder, get_task(task), seed=seed)
    return {k: v for k, v in model.state_dict().items() if k.startswith(("classifier.", "qa_outputs."))}


@pytest.mark.parametrize("task", ["sst2", "conll2003", "squad", "mnli-compacted"])
def test_a_new_head_comes_from_the_seed_alone(task, tmp_path, compacted_dir):
    """transformers draws a new head from the global generator after however many numbers its loading took (4.57
    and 5.x differ), so one seed fine-tuned different teachers in two environments; the head is now drawn from the
    seed alone, as BERT initialises one (normal weights, zero biases), and nothing else is touched."""
    base = tiny_model("bert", masked_lm=True)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer("bert").save_pretrained(tmp_path / "base")
    folder, task = (compacted_dir[1], "mnli") if task == "mnli-compacted" else (tmp_path / "base", task)
    first, again, other = _new_head(folder, task, 7, 1), _new_head(folder, task, 7, 999), _new_head(folder, task, 8, 1)
    assert first and first.keys() == again.keys() == other.keys()
    assert all(torch.equal(v, again[k]) for k, v in first.items())
    assert all(not torch.equal(v, other[k]) for k, v in first.items() if k.endswith("weight"))
    assert all(not v.any() for k, v in first.items() if k.endswith("bias"))
    if folder == tmp_path / "base":
        model = load_base_model(folder, get_task(task), seed=7)
        name = "bert.encoder.layer.0.attention.self.query.weight"
        assert torch.equal(model.state_dict()[name], base.state_dict()[name])  # the pretrained weights as saved


def test_a_mismatch_outside_the_head_is_an_error(tmp_path):
    model = tiny_model("bert")
    model.config.intermediate_size = 48  # the config no longer describes the weights
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer("bert").save_pretrained(tmp_path / "m")
    with pytest.raises(PipelineError, match=r"shapes differ from its config in bert\.encoder\.layer\.0\.intermediate"):
        load_base_model(tmp_path / "m", get_task("sst2"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("key", ["teacher.device", "config.train.device"])
def test_a_missing_cuda_device_fails_before_any_stage(key, tmp_path):
    result = cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--output", "out", "--set", f"{key}=cuda")
    assert_one_line_error(result, f"{key}=cuda, but this machine has no CUDA device")


def test_a_named_data_source_that_fails_is_an_error_naming_it():
    """The hub was tried silently and the sample used instead; now a named source fails, naming it."""
    spec = get_task("sst2")
    assert resolve_source(spec, None, hub=True) == "hub"
    with pytest.raises(
        PipelineError, match="--hub: dataset glue/sst2 could not be loaded from the local datasets cache"
    ):
        load_task_data("sst2", source="hub")
    result = cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--hub")
    assert_one_line_error(result, "--hub: dataset glue/sst2 could not be loaded")
    with pytest.raises(PipelineError, match="--data-dir or --hub, not both"):
        resolve_source(spec, "data", hub=True)


def test_the_sample_is_used_only_when_no_source_is_named_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert resolve_source(get_task("sst2"), None) == "sample"
    assert "no data source named: using the embedded sst2 sample" in caplog.text
    with pytest.raises(PipelineError, match=r"no data for task 'rte' .* pass --data-dir DIR or --hub"):
        resolve_source(get_task("rte"), None)


@pytest.mark.e2e
def test_a_failing_prefect_report_does_not_fail_a_published_run(base_dirs, tmp_path):
    """The Prefect UI artifacts are made before publishing and cannot fail the run (they used to be made after
    the artifact folder was published, so their failure turned a finished run into exit code 1)."""
    args, env = quick_args("mlp_fusion", base_dirs["bert"], tmp_path, "--steps", "2", "--set", "config.tune_steps=1",
                           "--set", "config.train.max_length=24", *LOOSE_GATES)  # fmt: skip
    code = (
        "import sys, flows.deploy as d\n"
        "def boom(**kwargs): raise RuntimeError('the Prefect API is down')\n"
        "d.create_markdown_artifact = boom\n"
        "from pipeline.cli import main\n"
        f"sys.argv = ['pipeline', 'deploy', *{args!r}]\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "could not create the Prefect report artifacts: RuntimeError: the Prefect API is down" in result.stderr
    artifact = Path(result.stdout.strip().splitlines()[-1])
    report = json.loads((artifact / "report.json").read_text())
    # compaction and validation tokenise as the recipe says, not at a literal 128 tokens
    assert report["compaction"]["max_length"] == 24 and report["validation"]["max_length"] == 24


def test_a_teacher_alone_is_the_model_and_the_embedded_one_is_never_read(classifier_dirs, tmp_path, monkeypatch):
    """With only --teacher nothing trains from a base model: the request's model is the teacher's folder (its family
    is what the checks see), and the embedded MiniLM package is not even imported."""
    import pipeline.request as request_module

    def no_embedded_model():
        raise AssertionError("the embedded base model was looked up")

    monkeypatch.setattr(request_module, "default_model_path", no_embedded_model)
    teacher = classifier_dirs["roberta"]
    request = request_module.prepare_request(
        "mlp_fusion", "sst2", teacher=str(teacher), output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "c")
    )
    assert request.model == request.teacher == str(Path(teacher).resolve())
