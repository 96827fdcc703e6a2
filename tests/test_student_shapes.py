"""benchmarks/student_shapes.py: random-weight students of a tiny teacher exported and timed for real (no timing
asserts), and its one-line refusals."""

import json

import pytest

from benchmarks.student_shapes import main, parse_shapes
from tests.helpers import write_tiny_model_dir


def test_each_shape_is_exported_at_its_size_and_timed_against_both_dense_graphs(tmp_path, capsys):
    teacher = write_tiny_model_dir(tmp_path / "teacher")  # hidden 32, two heads of 16
    out = tmp_path / "shapes.json"
    argv = [str(teacher), "1x16x32", "2x32x48", "--batch", "1", "--seq", "8", "--max-runs", "3", "--threads", "1",
            "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    assert main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["shapes"]["1x16x32"] == {"layers": 1, "hidden": 16, "heads": 1, "ffn": 32}
    assert record["shapes"]["2x32x48"]["heads"] == 2
    assert {c["model"] for c in record["cells"]} == {"dense", "dense-int8", "1x16x32", "2x32x48"}
    assert all(c["p50_ms"] > 0 for c in record["cells"])
    printed = capsys.readouterr().out
    assert "1x16x32" in printed and "vs int8" in printed


@pytest.mark.parametrize(
    ("spec", "says"),
    [("3x256", "LAYERSxHIDDENxFFN"), ("0x16x32", "positive"), ("1x24x32", "multiple of the teacher's head size 16"),
     ("1x64x32", "up to its 32")],
)  # fmt: skip
def test_a_bad_shape_is_refused_in_one_line(spec, says, tmp_path, capsys):
    teacher = write_tiny_model_dir(tmp_path / "teacher")
    capsys.readouterr()  # what saving the teacher printed (transformers 5 draws a progress bar)
    with pytest.raises(ValueError, match=says):
        parse_shapes([spec], json.loads((teacher / "config.json").read_text()))
    with pytest.raises(SystemExit) as stop:
        main([str(teacher), spec])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: shape") and "\n" not in err
