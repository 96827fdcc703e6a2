"""Training options that change how steps run, not what a stage means: bf16 mixed precision and length-grouped
batches."""

import pytest
import torch

from pipeline.data.loaders import DataRef
from pipeline.models.io import load_model
from pipeline.request import build_deploy_config
from pipeline.stages.compress import run as compress

DATA = DataRef("sst2", "sample", None, 64, 16)
STEPS = ["train.max_steps=12", "train.batch_size=8", "train.eval_every=4"]


def test_bf16_training_runs_and_leaves_fp32_cache_keys_as_they_were(classifier_dirs, tmp_path, monkeypatch):
    from pipeline import devices
    from pipeline.config.schema import TrainConfig

    monkeypatch.setattr(devices, "native_bf16_cpu", lambda: True)  # emulated bf16: slow, not wrong, for 12 steps

    assert "precision" not in TrainConfig().model_dump()  # fp32 stages keep the keys they had before bf16 existed
    assert TrainConfig(precision="bf16").model_dump()["precision"] == "bf16"
    assert TrainConfig().model_dump(include={"lr"}) == {"lr": TrainConfig().lr}  # Prefect dumps parts of configs
    base = ["config.layers=[1]", "config.tune_steps=0", *(f"config.{o}" for o in STEPS)]
    fp32, bf16 = (
        compress(
            build_deploy_config("mlp_fusion", "sst2", overrides=base + extra),
            str(classifier_dirs["bert"]),
            DATA,
            str(tmp_path / "cache"),
        )
        for extra in ([], ["config.train.precision=bf16"])
    )
    assert bf16["path"] != fp32["path"]  # another entry: precision is part of a bf16 stage's key
    a, b = (load_model(r["path"]).state_dict() for r in (bf16, fp32))
    assert all(torch.isfinite(v).all() for v in a.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the steps ran in another precision


def test_grouping_by_length_keeps_every_example_once_and_pads_less():
    from pipeline.data.encoding import iter_batches
    from pipeline.kinds.base import Encoded

    rng = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 60, (500,), generator=rng).tolist()
    enc = Encoded([{"input_ids": [7] * n, "attention_mask": [1] * n} for n in lengths], list(range(500)), 0)

    def batches(group: bool, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        return list(iter_batches(enc, 8, shuffle=True, generator=g, group_by_length=group))

    grouped, plain = batches(True), batches(False)
    assert sorted(int(x) for b in grouped for x in b["labels"]) == list(range(500))  # each example once
    assert sum(b["input_ids"].numel() for b in grouped) < 0.6 * sum(b["input_ids"].numel() for b in plain)
    assert [b["labels"].tolist() for b in batches(True)] == [b["labels"].tolist() for b in grouped]  # seeded
    assert [b["labels"].tolist() for b in batches(True, 1)] != [b["labels"].tolist() for b in grouped]


def test_bf16_on_a_cpu_without_native_bfloat16_is_one_line(classifier_dirs, tmp_path, monkeypatch):
    from pipeline import devices
    from pipeline.errors import PipelineError

    monkeypatch.setattr(devices, "native_bf16_cpu", lambda: False)
    overrides = ["config.layers=[1]", "config.tune_steps=0", "config.train.precision=bf16", "config.train.device=cpu"]
    config = build_deploy_config("mlp_fusion", "sst2", overrides=overrides + [f"config.{o}" for o in STEPS])
    with pytest.raises(PipelineError, match=r"bf16 needs a GPU or a CPU with native bfloat16") as caught:
        compress(config, str(classifier_dirs["bert"]), DATA, str(tmp_path / "cache"))
    assert "\n" not in str(caught.value)
    assert not list((tmp_path / "cache").rglob("model.safetensors"))  # nothing cached


@pytest.mark.parametrize(("native", "device", "resolved"), [
    (True, "cpu", "bf16"), (False, "cpu", "fp32"), (False, "auto", "fp32"), (True, "auto", "bf16"),
])  # fmt: skip
def test_auto_precision_is_decided_when_the_config_is_read(native, device, resolved, monkeypatch):
    from pipeline import devices
    from pipeline.config.schema import TrainConfig

    monkeypatch.setattr(devices, "native_bf16_cpu", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = TrainConfig(precision="auto", device=device)
    assert cfg.precision == resolved  # the config, its cache key and the report say what the steps ran in
    assert TrainConfig.model_validate_json(cfg.model_dump_json()) == cfg
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert TrainConfig(precision="auto", device="cuda").precision == "bf16"


@pytest.mark.parametrize("recipe", ["embedding", "embedding-shallow"])
@pytest.mark.parametrize("native", [True, False])
def test_the_embedding_recipes_recover_in_bf16_where_it_is_fast(recipe, native, monkeypatch):
    from pipeline import devices

    monkeypatch.setattr(devices, "native_bf16_cpu", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    distill, smp = build_deploy_config("distill+smp", "stsb", recipe, ["target.speedup=8"]).chain
    assert smp.train.precision == ("bf16" if native else "fp32") and smp.train.group_by_length
    assert distill.train.precision == "fp32"  # its cached stages were trained so; SMP's bf16 was measured


def test_the_loop_s_adamw_is_fused_on_cpu_and_steps_as_the_unfused_one_does():
    from pipeline.train.loop import _param_groups, adamw

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.LayerNorm(6)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    fused = adamw(_param_groups(list(models[0].named_parameters()), 0.01), 1e-2, torch.device("cpu"))
    plain = torch.optim.AdamW(_param_groups(list(models[1].named_parameters()), 0.01), lr=1e-2)
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    for _ in range(5):
        x = torch.randn(3, 8)
        for model, opt in zip(models, (fused, plain), strict=True):
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    fused.load_state_dict(plain.state_dict())  # a checkpoint from before the fused update resumes
