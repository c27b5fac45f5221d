"""Writing a small file so that a reader sees the old content or the new one, never a part."""

import os
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
