"""Students built from the teacher, the distill method's checks, and one distillation run end to end."""

import json

import pytest
import torch

from pipeline.compress.compaction import narrow_
from pipeline.compress.methods.distill.config import StudentConfig, check_student_folder, pick_layers
from pipeline.compress.methods.distill.students import build_student
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.layers import encoder_layers, ffn_widths, head_counts
from tests.helpers import tiny_model


def test_layer_picks():
    assert pick_layers(6, StudentConfig(layers=3)) == [1, 3, 5]  # every other layer, ending with the top one
    assert pick_layers(12, StudentConfig(layers=5)) == [1, 4, 6, 9, 11]
    assert pick_layers(6, StudentConfig(layers=2, pick="first")) == [0, 1]
    assert pick_layers(6, StudentConfig(layers=2, pick="last")) == [4, 5]
    assert pick_layers(6, StudentConfig(layers=[4, 0])) == [0, 4]
    with pytest.raises(PipelineError, match="between 1 and the teacher's 6"):
        pick_layers(6, StudentConfig(layers=7))


def test_student_keeps_the_picked_teacher_layers_and_trains():
    teacher = tiny_model("bert", layers=4).requires_grad_(False)
    student, info = build_student(teacher, StudentConfig(layers=2), get_task("sst2"))
    assert info["teacher_layers"] == [1, 3] and student.config.num_hidden_layers == 2
    for s_layer, t_index in zip(encoder_layers(student), [1, 3], strict=True):
        t_layer = encoder_layers(teacher)[t_index]
        assert torch.equal(s_layer.output.dense.weight, t_layer.output.dense.weight)
    assert all(p.requires_grad for p in student.parameters()) and len(encoder_layers(teacher)) == 4


def test_narrowing_keeps_the_most_important_units():
    model = tiny_model("bert", layers=1, heads=4)
    layer = encoder_layers(model)[0]
    with torch.no_grad():
        layer.attention.output.dense.weight[:, 16:24] *= 10  # head 2 (of size 8) writes the most
        layer.output.dense.weight[:, 5] *= 100  # neuron 5 writes the most
        kept_head = layer.attention.output.dense.weight[:, 16:24].clone()
        kept_row = layer.intermediate.dense.weight[5].clone()
    narrow_(model, heads=1, ffn=8)
    assert head_counts(model) == [1] and ffn_widths(model) == [8]
    new = encoder_layers(model)[0]
    assert torch.equal(new.attention.output.dense.weight, kept_head)
    assert any(torch.equal(row, kept_row) for row in new.intermediate.dense.weight)


def test_student_folder_must_tokenize_like_the_teacher(base_dirs):
    with pytest.raises(PipelineError, match="tokenizes differently from the teacher"):
        check_student_folder(base_dirs["roberta"], base_dirs["bert"])
    assert check_student_folder(base_dirs["bert"], base_dirs["bert"])["model_type"] == "bert"


@pytest.mark.e2e
def test_distill_deploys_a_shallower_student(base_dirs, tmp_path):
    from tests.helpers import quick_deploy

    _, artifact = quick_deploy(
        "distill",
        base_dirs["bert"],
        tmp_path,
        "--steps",
        "3",
        "--set",
        "config.student.layers=1",
        "--set",
        "config.relation_heads=4",
        "--set",
        "config.hidden=1.0",
        "--set",
        "config.hidden_mapping=uniform_last",
        "--set",
        "config.transfer_steps=2",
    )
    report = json.loads((artifact / "report.json").read_text())
    assert report["validation"]["passed"]
    assert report["compress"]["student"]["teacher_layers"] == [1]
    assert report["compress"]["hidden_mapping"] == {"1": [2]}
    assert json.loads((artifact / "config.json").read_text())["num_hidden_layers"] == 1
    assert report["speed"]["params"]["compressed"] < report["speed"]["params"]["dense"]


def test_layer_kd_into_a_student_folder_of_another_width_is_refused_before_training(classifier_dirs, tmp_path):
    from pipeline.compress.methods.distill.config import DistillConfig
    from pipeline.compress.methods.distill.general_student import build_general_student
    from pipeline.models.folders import load_tokenizer
    from pipeline.models.io import load_model, save_model

    teacher = classifier_dirs["bert"]
    narrow, _ = build_general_student(
        load_model(teacher), {"layers": 1, "hidden": 16, "heads": 2, "ffn": 32}, "teacher", 0
    )
    save_model(narrow, load_tokenizer(teacher), tmp_path / "student")
    config = json.loads((teacher / "config.json").read_text())
    cfg = DistillConfig(
        student={"path": str(tmp_path / "student")}, transfer_steps=0, relation=0.0, train={"layer_kd": 1.0}
    )
    with pytest.raises(PipelineError, match="the student's width 16 is not the teacher's 32"):
        cfg.preflight(teacher, teacher, config, get_task("sst2"))
    cfg.updated(train={"layer_kd": 0.0}).preflight(teacher, teacher, config, get_task("sst2"))  # without: fine


def test_task_kd_adds_train_layer_kd_times_each_student_layers_hidden_mse_to_its_teacher_layer():
    """`train.layer_kd` in distill's task loss (it was accepted and ignored): the 2-layer student of a 4-layer
    teacher adds β × the MSE of its layers 1 and 2 to the teacher's layers 2 and 4; the transfer phase's loss
    (`task=False`) has no such term."""
    from pipeline.compress.methods.distill.config import DistillConfig
    from pipeline.compress.methods.distill.stage import distill_loss
    from pipeline.data.encoding import encode, iter_batches
    from pipeline.data.loaders import load_task_data
    from tests.helpers import tiny_tokenizer

    torch.manual_seed(0)
    teacher = tiny_model("bert", layers=4).eval().requires_grad_(False)
    student, _ = build_student(teacher, StudentConfig(layers=2), get_task("sst2"))
    student.eval()
    with torch.no_grad():
        encoder_layers(student)[0].output.dense.weight.mul_(0.5)  # the student now differs from its picked layers
    enc = encode(tiny_tokenizer("bert"), load_task_data("sst2", source="sample", max_train=16).train, 32)
    batch = next(iter_batches(enc, 8, shuffle=False))
    base = DistillConfig(student={"layers": 2}, relation=0.0, transfer_steps=0, train={"kd_alpha": 0.5})
    layered = base.updated(train={"kd_alpha": 0.5, "layer_kd": 2.0})
    plain = distill_loss(base, teacher, None, task=True)(student, batch)
    with_mse = distill_loss(layered, teacher, None, task=True)(student, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    h_s = student(**inputs, output_hidden_states=True).hidden_states
    h_t = teacher(**inputs, output_hidden_states=True).hidden_states
    real = batch["attention_mask"].bool()
    mse = sum((h_s[i] - h_t[2 * i])[real].square().mean() for i in (1, 2))  # summed over the mapped pairs
    assert mse > 0 and with_mse.item() == pytest.approx(plain.item() + 2.0 * mse.item(), rel=1e-5)
    transfer = layered.updated(relation=1.0, relation_heads=4)
    assert distill_loss(transfer, teacher, None, task=False)(student, batch).item() == pytest.approx(
        distill_loss(transfer.updated(train={"layer_kd": 0.0}), teacher, None, task=False)(student, batch).item()
    )
    config = {**teacher.config.to_dict(), "architectures": ["BertForSequenceClassification"]}
    narrow = DistillConfig(student={"layers": 2, "hidden": 16}, relation_heads=4, train={"layer_kd": 1.0})
    with pytest.raises(PipelineError, match="the student's width 16 is not the teacher's 32"):
        narrow.preflight(None, None, config, get_task("sst2"))


def test_a_narrower_student_keeps_the_teachers_head_size_and_its_most_important_dimensions(tmp_path):
    from pipeline.compress.methods.distill.config import DistillConfig
    from pipeline.models.families import arch_of
    from pipeline.models.io import load_model, save_model
    from tests.helpers import sample_logits, tiny_family_model

    teacher = tiny_family_model("bert", layers=3, heads=4, hidden=32, ffn=40)  # head size 8
    student, info = build_student(teacher, StudentConfig(layers=2, hidden=16), get_task("sst2"))
    student.eval()
    assert info["teacher_layers"] == [1, 2] and info["heads"] == 2 and info["random"] == []
    assert head_counts(student) == [2, 2] and ffn_widths(student) == [40, 40]
    assert student.config.hidden_size == 16 and student.classifier.weight.shape == (2, 16)  # the head narrowed too
    save_model(student, None, tmp_path / "s")
    assert torch.equal(sample_logits(load_model(tmp_path / "s")), sample_logits(student))
    same, _ = build_student(teacher, StudentConfig(layers=3, hidden=32), get_task("sst2"))  # the teacher's width
    same.eval()
    assert torch.allclose(sample_logits(same), sample_logits(teacher), atol=1e-6)
    config = {**teacher.config.to_dict(), "architectures": ["BertForSequenceClassification"]}
    for student_cfg, error in (
        ({"hidden": 12}, "must be a multiple of the teacher's head size 8"),
        ({"hidden": 16, "heads": 2}, "keeps 2 heads a layer: leave out heads"),
    ):
        cfg = DistillConfig(student={"layers": 2, **student_cfg}, relation_heads=4)
        with pytest.raises(PipelineError, match=error):
            cfg.preflight(tmp_path, None, config, get_task("sst2"))
    assert arch_of(config).hidden == 32
    mpnet = {**tiny_family_model("mpnet").config.to_dict(), "architectures": ["MPNetForSequenceClassification"]}
    with pytest.raises(PipelineError, match="cannot be cut from its teacher at a narrower hidden size"):
        DistillConfig(student={"layers": 2, "hidden": 12}, relation_heads=4).preflight(
            tmp_path, None, mpnet, get_task("sst2")
        )


def test_a_narrower_student_distils_and_saves_at_its_width(classifier_dirs, tmp_path):
    from pipeline.models.io import load_model
    from tests.helpers import compress_sample

    over = ["config.student.layers=1", "config.student.hidden=16", "config.relation_heads=16",
            "config.transfer_steps=3", "config.train.max_steps=3", "config.train.batch_size=8"]  # fmt: skip
    out = compress_sample("distill", over, classifier_dirs["bert"], tmp_path / "cache")
    student = load_model(out["path"])
    assert student.config.hidden_size == 16 and head_counts(student) == [1]
    assert out["student"]["hidden"] == 16, out.keys()
