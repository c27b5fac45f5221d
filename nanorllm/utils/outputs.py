"""A path the user names for a program's output (--out): checked before anything loads, replaced only when whole.

Every program that writes where the user says (launch/sft.py, launch/sample.py, launch/train_reward_model.py)
follows one rule:
- nothing there, or an empty folder: written;
- this program's own earlier output (a folder holding the program's marker file): replaced;
- anything else (a folder of other files, an existing file): refused in one line naming it, before any model
  loads, unless --overwrite; a file where a folder goes, or a folder where a file goes, is refused even then.
The write itself is atomic (utils/files.py): the old output stays until the new one is complete and synced.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class OutputPath:
    """Where a program writes: a folder (with the file that marks it as this program's own) or one file."""

    path: str
    kind: Literal["folder", "file"]
    marker: str | None = None
    """For a folder: the file this program writes into every output of its own (e.g. sft.json)."""
    flag: str = "out"


def output_problems(out: OutputPath, overwrite: bool = False) -> list[str]:
    """Why `out` may not be written (one line each, naming the flag), or []: the check a program runs first."""
    path = Path(out.path)
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        return [f"{out.flag}: {out.path!r} lies under {str(parent)!r}, which is a file"]
    if not path.exists():
        return []
    if out.kind == "folder":
        return _folder_problems(out, path, overwrite)
    if path.is_dir():
        return [f"{out.flag}: {out.path!r} is a folder; this program writes one file there: give a file path"]
    return [] if overwrite else [f"{out.flag}: {out.path!r} exists: give a new path, or --overwrite to replace it"]


def _folder_problems(out: OutputPath, path: Path, overwrite: bool) -> list[str]:
    if not path.is_dir():
        return [f"{out.flag}: {out.path!r} is a file; this program writes a folder there: give a new or empty folder"]
    if overwrite or not any(path.iterdir()) or (out.marker is not None and (path / out.marker).is_file()):
        return []
    mark = f" (no {out.marker})" if out.marker else ""
    return [f"{out.flag}: {out.path!r} is a folder of other files{mark}: give a new or empty folder, or --overwrite "
            "to replace it"]
