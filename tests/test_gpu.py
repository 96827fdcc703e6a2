"""CUDA paths: the training loop on a GPU, and the ONNX Runtime CUDA benchmark pass. Skipped without CUDA."""

import pytest

from pipeline.config.schema import TrainConfig
from pipeline.data.encoding import encode_task
from pipeline.data.loaders import load_task_data
from pipeline.train.loop import train
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.mark.gpu
def test_training_loop_runs_on_cuda_and_returns_to_cpu():
    model, tokenizer = tiny_model("bert"), tiny_tokenizer("bert")
    train_enc, dev_enc = encode_task(tokenizer, load_task_data("sst2", source="sample", max_train=64, max_dev=32), 64)
    result = train(model, train_enc, dev_enc, TrainConfig(max_steps=4, batch_size=16, device="cuda"))
    assert result.steps == 4 and "accuracy" in result.validation
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.gpu
def test_benchmark_cuda_pass(tmp_path):
    import onnxruntime as ort

    from export.benchmark import benchmark
    from export.onnx import export_optimized
    from pipeline.config.schema import BenchSettings

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    export_optimized(tiny_model("bert"), tiny_tokenizer("bert"), tmp_path)
    result = benchmark(
        {"dense": tmp_path / "model.onnx", "int8": tmp_path / "model.int8.onnx"},
        400,
        BenchSettings(batch_sizes=(1,), seq_lens=(16,), warmup=1, min_runs=2, max_runs=3),
    )
    providers = {c["provider"] for c in result["cells"]}
    assert "CUDAExecutionProvider" in providers
    assert any(s["model"] == "int8" and s["provider"] == "CUDAExecutionProvider" for s in result["skipped"])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["token", "qa"])
def test_span_predictions_on_cuda_equal_the_cpus(kind):
    """Validation during training and the torch scores of span tasks run on the model's device: their padding masks
    must follow the batch there (QA's masked_fill met CUDA logits with a CPU mask)."""
    import numpy as np

    from pipeline.data.encoding import encode
    from pipeline.train.metrics import predict_logits, scores
    from tests.helpers import tiny_span_case

    model, split = tiny_span_case(kind)
    enc = encode(tiny_tokenizer("bert"), split, 64, stride=16)
    on_cpu = predict_logits(model, enc)
    on_cuda = predict_logits(model.to("cuda"), enc)
    assert np.allclose(on_cpu, on_cuda, atol=1e-4) and scores(on_cuda, enc) == scores(on_cpu, enc)
