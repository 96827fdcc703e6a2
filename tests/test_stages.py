"""The compress stage hands the method a trainable copy of the frozen teacher."""

import torch

from pipeline.data.loaders import DataRef
from pipeline.models.io import load_model
from pipeline.models.layers import encoder_layers
from pipeline.request import build_deploy_config
from pipeline.stages.compress import run as compress


def test_compress_trains_the_whole_student_not_only_new_layers(classifier_dirs, tmp_path):
    teacher_dir = classifier_dirs["bert"]
    cfg = build_deploy_config(
        "mlp_fusion",
        "sst2",
        overrides=[
            "config.layers=[1]",
            "config.tune_steps=0",
            "config.train.max_steps=2",
            "config.train.batch_size=8",
        ],
    )
    out = compress(cfg, str(teacher_dir), DataRef("sst2", "sample", None, 64, 16), str(tmp_path / "cache"))
    teacher, student = load_model(teacher_dir), load_model(out["path"])
    # layer 0 is not fused: it changes only if task training really updates the whole model (as the paper does)
    q_t, q_s = (encoder_layers(m)[0].attention.self.query.weight for m in (teacher, student))
    assert not torch.equal(q_t, q_s)
    assert not torch.equal(teacher.classifier.weight, student.classifier.weight)


def test_layerwise_tuning_runs_all_its_steps_on_a_small_training_set(classifier_dirs, tmp_path):
    """64 examples at batch 8 are 8 steps an epoch; `tune_steps=12` must run 12 (it was capped at one epoch)."""
    cfg = build_deploy_config(
        "mlp_fusion",
        "sst2",
        overrides=[
            "config.layers=[1]",
            "config.tune_steps=12",
            "config.train.max_steps=1",
            "config.train.batch_size=8",
        ],
    )
    out = compress(cfg, str(classifier_dirs["bert"]), DataRef("sst2", "sample", None, 64, 16), str(tmp_path / "cache"))
    assert out["tuning"]["steps"] == 12 and len(out["tuning"]["history"]) == 12
    assert out["training"]["steps"] == 1 and {"seconds", "final_loss", "validation"} <= set(out["training"])
