"""Fake int8 (quantisation-aware training): the rounding is ONNX Runtime's, gradients pass straight through, and the
training loop applies it to a stage's last steps only."""

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from export.onnx import export_optimized, quantize_int8
from pipeline.config.schema import TrainConfig
from pipeline.train.fake_quant import fake_int8
from tests.helpers import sample_inputs, sample_logits, tiny_family_model


def test_one_linear_rounds_as_onnx_runtime_dynamic_int8(tmp_path):
    torch.manual_seed(0)
    linear = nn.Linear(48, 20)
    with torch.no_grad():
        linear.weight[3] *= 40  # one row far wider than the rest: per-channel scales must differ
    x = torch.randn(2, 7, 48) * 3 + 0.5
    torch.onnx.export(linear, (x,), str(tmp_path / "l.onnx"), input_names=["x"], output_names=["y"], dynamo=False)
    quantize_int8(tmp_path / "l.onnx", tmp_path / "l.int8.onnx")
    session = ort.InferenceSession(str(tmp_path / "l.int8.onnx"), providers=["CPUExecutionProvider"])
    ort_int8 = session.run(["y"], {"x": x.numpy()})[0]
    with torch.no_grad():
        fp32 = linear(x).numpy()
        with fake_int8(linear):
            fake = linear(x).numpy()
        assert np.array_equal(linear(x).numpy(), fp32)  # its own forward again outside the block
    assert np.abs(ort_int8 - fp32).max() > 1e-2  # int8 rounding is visible at this scale
    assert np.abs(fake - ort_int8).max() <= 1e-4 * np.abs(ort_int8).max()


def test_a_model_under_fake_int8_is_nearer_its_int8_graph_and_still_learns(tmp_path):
    model = tiny_family_model("bert", hidden=48, ffn=64, init_range=0.5)
    export_optimized(model, None, tmp_path)
    ids, mask = sample_inputs()
    session = ort.InferenceSession(str(tmp_path / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    ort_int8 = session.run(["logits"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]
    fp32 = sample_logits(model).numpy()
    with fake_int8(model):
        fake = sample_logits(model).numpy()
        loss = model(input_ids=ids, attention_mask=mask).logits.square().sum()
        loss.backward()
    assert np.abs(fake - ort_int8).max() < np.abs(fp32 - ort_int8).max() / 2  # the embeddings stay unrounded
    query = model.bert.encoder.layer[0].attention.self.query
    assert query.weight.grad is not None and query.weight.grad.abs().sum() > 0  # straight through
    assert np.array_equal(sample_logits(model).numpy(), fp32)


def test_the_loop_rounds_only_the_last_steps_and_a_sub_phase_has_none(classifier_dirs):
    from pipeline.data.encoding import encode
    from pipeline.data.loaders import DataRef
    from pipeline.models.folders import load_tokenizer
    from pipeline.models.io import load_model
    from pipeline.train.loop import train
    from pipeline.train.losses import classification_loss

    model = load_model(classifier_dirs["bert"])
    data = DataRef("sst2", "sample", None, 64, 16).load()
    enc = encode(load_tokenizer(classifier_dirs["bert"]), data.train, 32)
    cfg = TrainConfig(max_steps=5, batch_size=8, fake_quant_steps=2)
    base, seen = classification_loss(None, cfg), []

    def loss_fn(m, batch):
        seen.append("forward" in vars(m.classifier))  # fake_int8 puts a forward on the instance
        return base(m, batch)

    train(model, enc, None, cfg, loss_fn=loss_fn)
    assert seen == [False, False, False, True, True]
    assert "forward" not in vars(model.classifier)
    assert cfg.phase(3, 1e-4).fake_quant_steps == 0 and "fake_quant_steps" not in TrainConfig().model_dump()
