"""The user's files and folders, checked before any work: text that must be UTF-8, folders that must be writable.

Each problem is one line naming the path (and, for text, the line and byte), raised as a `PipelineError`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.errors import PipelineError


def read_utf8(path: str | Path, what: str = "file") -> str:
    """The text of `path` (a leading byte-order mark dropped), or a one-line error where it is not UTF-8."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise PipelineError(
            f"{what} {path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None


def check_writable_dir(path: str | Path, what: str) -> Path:
    """A folder this run may create and write into: it exists as a folder, or its nearest existing ancestor is a
    writable folder (probed with a temporary file, removed at once). The error names the path in the way."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PipelineError(f"{what} {path} is a file, not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PipelineError(f"{what} {path}: {existing} is a file, not a folder")
    try:  # a real write: permissions, read-only mounts and pseudo-filesystems alike (root passes os.access)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise PipelineError(f"{what} {path} is not writable: {existing}: {e.strerror or e}") from None
    return path


def check_new_folder(path: str | Path, what: str) -> Path:
    """A folder this run writes whole: it must not exist yet (nothing of the user's is overwritten or merged)."""
    path = Path(path)
    if path.exists():
        raise PipelineError(f"{what} {path} already exists; the {what} is written to a new folder")
    return path
