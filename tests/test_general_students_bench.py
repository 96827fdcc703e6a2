"""benchmarks/general_students.py asks `pipeline deploy` for what each variant of the general-students comparison
means: the configs its flags resolve to, and the embedded MiniLM teacher's preflight of them."""

import importlib.util
import json
from pathlib import Path

import pytest

from pipeline.compress.methods.distill import derived as rules
from pipeline.data.tasks import get_task
from pipeline.models.folders import default_model_path
from pipeline.request import build_deploy_config

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "general_students.py"


def _script():
    spec = importlib.util.spec_from_file_location("general_students", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _distill_config(monkeypatch, tmp_path, variant, shape, student):
    module = _script()
    seen = []
    monkeypatch.setattr(module, "run", lambda cmd: seen.append(cmd) or str(tmp_path / "artifact"))
    args = type("Args", (), {"task": "sst2", "data_dir": "D", "work": tmp_path, "set": ["gates.max_metric_drop=20"]})
    module.deploy(args, variant, shape, student)
    (cmd,) = seen
    sets = [cmd[i + 1] for i, flag in enumerate(cmd) if flag == "--set"]
    config = build_deploy_config("distill", "sst2", overrides=sets)
    assert config.gates.max_metric_drop == 20  # --set reaches every deploy
    return next(c for _, c in config.chain_configs)


@pytest.mark.parametrize("shape", [(3, 384), (4, 256)])
def test_task_variant_is_the_general_students_shape_cut_from_the_teacher(monkeypatch, tmp_path, shape):
    cfg = _distill_config(monkeypatch, tmp_path, "task", shape, None)
    assert (cfg.student.layers, cfg.student.hidden, cfg.student.ffn) == (shape[0], shape[1], 4 * shape[1])
    assert cfg.student.path is None and cfg.transfer_steps > 0 and cfg.relation > 0
    # unset, derived from both widths where used: the paper's 48 for 384, 32 for 384 and 256
    assert cfg.relation_heads is None
    assert rules.relation_heads(None, 384, shape[1]).value == (48 if shape[1] == 384 else 32)
    model_dir = default_model_path()
    cfg.preflight(model_dir, None, json.loads((model_dir / "config.json").read_text()), get_task("sst2"))


@pytest.mark.parametrize(
    "variant, relation, transfer", [("general", 0, 0), ("general-joint", 1, 0), ("general+task", 1, 300)]
)
def test_general_variants_start_from_the_folder(monkeypatch, tmp_path, variant, relation, transfer):
    cfg = _distill_config(monkeypatch, tmp_path, variant, (4, 256), tmp_path / "student")
    assert cfg.student.path == str(tmp_path / "student")
    assert (cfg.relation, cfg.transfer_steps, cfg.relation_heads) == (relation, transfer, None)
