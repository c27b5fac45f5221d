"""Writing a file or a folder so that a reader sees the old content or the new one, never a part, and never
neither: the old stays in place until the new one is whole and synced, then one rename swaps them."""

import ctypes
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

_RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing paths in one step


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
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_folder_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into `<path>.tmp`, fsync what it wrote, then swap it with `path` in one rename and delete the old
    folder: a crash or a full disk at any point leaves the old folder whole (or the new one), never a part that looks
    whole (a model folder with its config.json and no weights) and never no folder at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        exchange(tmp, path)  # tmp now holds the old folder
        fsync_dir(path.parent)
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, path)
        fsync_dir(path.parent)


def exchange(a: Path, b: Path) -> None:
    """Swap two existing paths atomically (Linux renameat2 RENAME_EXCHANGE). Where the kernel or file system has no
    exchange: `b` is renamed aside, `a` into its place, then the aside copy back to `a`'s name; a crash between
    the two renames leaves `b`'s old content at `<b>.old`, never deleted."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(a), None, str(b))
    aside = b.with_name(b.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def fsync_tree(root: Path) -> None:
    """Every file and folder under `root` on disk, so a rename that publishes `root` never publishes empty files."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def fsync_dir(path: Path) -> None:
    """A folder's entries on disk (a rename in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
