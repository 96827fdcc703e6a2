"""The deploy flow's stages by hand: `pipeline compress` into a work folder, then compact, export, validate,
bench and package over it, with deploy's gates and one-line errors; `pipeline evaluate` scores the artifact."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from tests.helpers import LOOSE_GATES, QUICK_BENCH, assert_one_line_error

SAMPLE = Path(__file__).parents[1] / "pipeline" / "data" / "samples" / "sst2"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.e2e  # a whole deploy, stage by stage
def test_every_stage_by_hand_makes_the_artifact_deploy_makes(classifier_dirs, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    common = ("--task", "sst2", "--teacher", classifier_dirs["bert"], "--data-dir", SAMPLE, "--max-train", "200",
              "--max-dev", "32", "--steps", "2", "--set", "data.validation_seed=1",
              *LOOSE_GATES, *QUICK_BENCH)  # fmt: skip
    done = cli("compress", "--method", "mlp_fusion", *common, "--work", work, "--output", out)
    assert done.exit_code == 0, done.output
    state = json.loads((work / "state.json").read_text())
    assert state["compressed"]["method"] == "mlp_fusion" and state["reports"] == {}

    assert_one_line_error(cli("export", work), f"run `pipeline compact {work}` first")
    assert_one_line_error(cli("package", work), f"run `pipeline bench {work}` first")
    assert_one_line_error(cli("compact", tmp_path / "nowhere"), "is not a work folder of `pipeline compress`")
    for stage in ("compact", "export", "validate", "bench"):
        result = cli(stage, work)
        assert result.exit_code == 0, (stage, result.output)
    assert (work / "pytorch" / "model.safetensors").is_file() and (work / "model.int8.onnx").is_file()
    state = json.loads((work / "state.json").read_text())
    assert list(state["reports"]) == ["compaction", "export", "validation", "speed"]
    assert state["reports"]["compaction"]["max_abs_diff"] <= 1e-5

    # a gate that fails by hand fails as in deploy: exit 1, one line; it and the later stages must be redone
    strict = json.loads((work / "state.json").read_text())
    strict["config"]["gates"]["onnx_atol"] = 1e-12
    (work / "state.json").write_text(json.dumps(strict))
    failed = cli("validate", work)
    assert failed.exit_code == 1
    assert failed.stderr.strip().splitlines()[-1].startswith("error: validation failed: ONNX fp32 vs torch")
    assert_one_line_error(cli("package", work), f"run `pipeline bench {work}` first")
    loose = json.loads((work / "state.json").read_text())
    assert list(loose["reports"]) == ["compaction", "export"]
    loose["config"]["gates"]["onnx_atol"] = 1e-4
    (work / "state.json").write_text(json.dumps(loose))
    assert_one_line_error(cli("bench", work), f"run `pipeline validate {work}` first")
    assert cli("validate", work).exit_code == 0 and cli("bench", work).exit_code == 0

    published = cli("package", work)
    assert published.exit_code == 0, published.output
    artifact = Path(published.stdout.strip().splitlines()[-1])
    assert artifact.parent == out and (artifact / "manifest.json").is_file()
    assert not (artifact / "state.json").exists() and not (artifact / ".work").exists()
    report = json.loads((artifact / "report.json").read_text())
    assert {"compress", "compaction", "export", "validation", "speed"} <= set(report)

    # evaluate: the artifact's graphs on a labelled split, the same figures validation reported on dev
    scored = cli("evaluate", artifact, "--data-dir", SAMPLE, "--split", "dev", "--max-examples", "32")
    assert scored.exit_code == 0, scored.output
    figures = json.loads(scored.stdout)
    assert figures["examples"] == 32
    assert figures["metrics"]["onnx_int8"] == report["validation"]["metrics"]["dev"]["onnx_int8"]
    # and on the validation split the run carved (with its own seed, not the default), the figures its gates saw
    scored = cli("evaluate", artifact, "--data-dir", SAMPLE, "--split", "validation")
    validated = report["validation"]["metrics"]["validation"]
    assert json.loads(scored.stdout)["metrics"] == {g: validated[g] for g in ("onnx_fp32", "onnx_int8", "onnx_fp16")}
    assert_one_line_error(cli("evaluate", artifact, "--data-dir", SAMPLE, "--split", "test"), "unknown split 'test'")
    assert_one_line_error(cli("evaluate", tmp_path, "--data-dir", SAMPLE), "is not an artifact folder")


def test_compress_refuses_a_work_folder_in_use(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "x").write_text("")
    result = cli("compress", "--method", "smp", "--task", "sst2", "--work", tmp_path / "work")
    assert_one_line_error(result, "exists and is not empty")
