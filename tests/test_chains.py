"""Chains of methods (`distill+smp`): every stage cached on its own, compaction exact between stages, the
dense-int8 baseline (`none`), and the chains that cannot run."""

import json
from pathlib import Path

import pytest

from pipeline.compress.registry import parse_chain
from pipeline.errors import PipelineError
from pipeline.request import build_deploy_config
from tests.helpers import assert_one_line_error, cli_deploy, quick_deploy, write_tiny_model_dir

CHAIN_BUDGET = (
    "--set", "config.distill.student.layers=2", "--set", "config.distill.relation_heads=4",
    "--set", "config.distill.transfer_steps=3", "--set", "config.distill.train.max_steps=3",
    "--set", "config.smp.train.max_steps=4", "--set", "config.smp.recover_steps=2",
    "--set", "config.smp.mask.shape={heads: 2, ffn: 32}",
)  # fmt: skip


@pytest.mark.e2e
def test_a_chain_runs_end_to_end_with_each_stage_cached_and_exact_compaction(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny4", layers=4, heads=4)
    _, artifact = quick_deploy("distill+smp", model, tmp_path, *CHAIN_BUDGET)
    report = json.loads((artifact / "report.json").read_text())
    stages = report["compress"]["stages"]
    assert [s["method"] for s in stages] == ["distill", "smp"]
    assert stages[0]["student"]["teacher_layers"] == [1, 3]  # 4 -> 2 layers, uniform pick
    between = json.loads((Path(stages[0]["compacted"]["path"]) / "stage.json").read_text())
    assert between["max_abs_diff"] <= between["atol"] == 1e-5  # exact compaction between the stages
    assert report["compaction"]["max_abs_diff"] <= 1e-5  # and at the end
    config = json.loads((artifact / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["layer_heads"] == [2, 2]
    assert config["intermediate_sizes"] == [32, 32]
    assert not any(s["cached"] for s in stages)

    # the same chain again: every stage and the intermediate compaction come from the cache
    again_args = ("--output", str(tmp_path / "out2"))
    _, again = quick_deploy("distill+smp", model, tmp_path, *CHAIN_BUDGET, *again_args)
    stages2 = json.loads((again / "report.json").read_text())["compress"]["stages"]
    assert all(s["cached"] for s in stages2) and stages2[0]["compacted"]["cached"]
    # a different last stage reuses the first
    _, third = quick_deploy("distill+smp", model, tmp_path, *CHAIN_BUDGET, "--set", "config.smp.recover_steps=1",
                            "--output", str(tmp_path / "out3"))  # fmt: skip
    stages3 = json.loads((third / "report.json").read_text())["compress"]["stages"]
    assert stages3[0]["cached"] and not stages3[1]["cached"]


@pytest.mark.e2e
def test_method_none_ships_the_dense_teacher_against_dense_int8(classifier_dirs, tmp_path):
    _, artifact = quick_deploy("none", classifier_dirs["bert"], tmp_path, "--set", "export.int8=static",
                               "--set", "bench.real_length_rounds=1")  # fmt: skip
    report = json.loads((artifact / "report.json").read_text())
    assert report["export"]["compressed"]["int8"] == "static" and report["export"]["dense"]["int8"] == "static"
    assert report["compress"]["stages"] == [] and report["compaction"]["removed_heads"] == [0, 0]
    assert report["speed"]["params"]["dense"] == report["speed"]["params"]["compressed"]
    metrics = report["validation"]["metrics"]
    assert set(metrics) == {"validation", "dev"}
    assert metrics["dev"]["onnx_int8"] == metrics["dev"]["teacher_onnx_int8"]  # the same graph, quantised alike
    ratios = {r["model"]: r for r in report["speed"]["speedups"]}
    assert ratios["compressed-int8"]["speedup_vs_dense_int8"] is not None
    real = report["speed"]["real_lengths"]  # the dev set's own sentences, padded per batch of the headline's 8
    assert real["examples"] == report["validation"]["examples"]["dev"] and real["batch"] == 8
    assert set(real["models"]) == {"dense", "dense-int8", "compressed", "compressed-int8"}
    assert real["models"]["dense"]["speedup"] == 1.0 and real["models"]["dense-int8"]["speedup_vs_dense_int8"] == 1.0
    assert "### Real lengths" in (artifact / "report.md").read_text()


@pytest.mark.parametrize(
    ("method", "needle"),
    [
        ("smp+distill", "distill cannot follow smp"),
        ("distill+", "has an empty link"),
        ("+", "has an empty link"),
        ("smp+smp", "names smp twice"),
        ("none+smp", "none cannot be chained"),
        ("distill+pruning", "unknown method 'pruning'"),
    ],
)
def test_a_chain_that_cannot_run_is_one_line(method, needle):
    with pytest.raises(PipelineError, match=needle):
        parse_chain(method)
    assert_one_line_error(cli_deploy("--method", method, "--task", "sst2"), needle)


def test_a_chain_config_has_one_section_per_method():
    cfg = build_deploy_config("distill+smp", "sst2", overrides=["config.smp.sparsity=0.4"])
    assert [(m.name, c.sparsity if m.name == "smp" else None) for m, c in cfg.chain_configs] == [
        ("distill", None),
        ("smp", 0.4),
    ]
    composed = build_deploy_config("distill+gmp", "sst2")  # no packaged chain recipe: composed from both
    assert [m.name for m, _ in composed.chain_configs] == ["distill", "gmp"]
    with pytest.raises(PipelineError, match="unknown section"):
        build_deploy_config("distill+smp", "sst2", overrides=["config.mlp_fusion.ratio=0.5"])
