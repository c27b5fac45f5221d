"""Writing a file or a folder so that a reader sees the old content or the new one, never a part."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write to `<path>.tmp`, fsync it, rename it over `path`: a crash or a full disk leaves the old file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_folder_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into `<path>.tmp`, then rename it over `path`: a crash or a full disk mid-write leaves the old
    folder (or none), never a part that looks whole (a model folder with its config.json and no weights)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """A folder's entries on disk (a rename in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
