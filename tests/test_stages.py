"""The compress stage hands the method a trainable copy of the frozen teacher."""

import torch

from pipeline.config import build_deploy_config
from pipeline.data import DataRef
from pipeline.modeling import encoder_layers, load_model
from pipeline.stages import compress


def test_compress_trains_the_whole_student_not_only_new_layers(classifier_dirs, tmp_path):
    teacher_dir = classifier_dirs["bert"]
    cfg = build_deploy_config("mlp_fusion", "sst2", overrides=[
        "config.layers=[1]", "config.tune_steps=0", "config.train.max_steps=2", "config.train.batch_size=8",
    ])
    out = compress(cfg, str(teacher_dir), DataRef("sst2", "sample", None, 64, 16), str(tmp_path / "cache"))
    teacher, student = load_model(teacher_dir), load_model(out["path"])
    # layer 0 is not fused: it changes only if task training really updates the whole model (as the paper does)
    q_t, q_s = (encoder_layers(m)[0].attention.self.query.weight for m in (teacher, student))
    assert not torch.equal(q_t, q_s)
    assert not torch.equal(teacher.classifier.weight, student.classifier.weight)
