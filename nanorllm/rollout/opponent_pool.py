"""`--opponent pool`: a game's other seats played by the policy's own earlier weights (a snapshot pool), so the
policy keeps meeting the players it used to be instead of only its latest self.

Where the snapshots come from: after the update that makes policy version v, for v a multiple of --pool-every, the
learner writes the policy's weights as a plain model folder `<run>/pool/step_<v>/` (LoRA merged), before those
weights go to the workers; version 0 is --model itself. Which a rollout draws from: one sampled at version v plays
against `pool_steps(v)`, the last --pool-size of 0, N, 2N, ... up to v; each game's opponent is one of them,
picked by the game's group id and index (`pick`), so the same game meets the same snapshot serial or pipelined and
after a resume. The learner keeps on disk what a rollout or a resume may still ask for (`kept_steps`): the pools of
the versions its workers may still sample at and of each checkpoint it keeps; a resumed run removes the snapshots past
its checkpoint (the stopped run's future, written again as the run gets there).

Each process that rolls out holds the current pool's models, frozen (`OpponentPool`): --pool-size models at most,
counted by the memory plan; a snapshot that leaves the pool is dropped, one that joins is loaded when first drawn.
"""

import shutil
import zlib
from pathlib import Path
from typing import Callable

from nanorllm.utils.files import write_folder_atomic

POOL_DIR = "pool"
PREFIX = "step_"
NOT_FOR_EVAL = ("eval_opponent: 'pool' is the training policy's own snapshots, which move with it; held-out "
                "evaluation plays a fixed opponent (base, random, self, a model or an endpoint)")


def pool_steps(version: int, every: int, size: int) -> list[int]:
    """The snapshots a rollout at policy `version` draws from: the last `size` of 0, every, 2 every, ... <= version."""
    return list(range(0, version + 1, every))[-size:]


def kept_steps(version: int, *, lag: int, checkpoints: list[int], every: int, size: int) -> set[int]:
    """The snapshots still wanted after the learner made `version`: a worker may still sample at any version from
    version - lag, and a resume starts at one of the `checkpoints` on disk (an older one where the newest does not
    load)."""
    versions = list(range(max(version - lag, 0), version + 1)) + list(checkpoints)
    return {s for v in versions for s in pool_steps(v, every, size)}


def pick(n: int, group_id: str, index: int) -> int:
    """Which of `n` pool members plays the task's `index`-th game of group `group_id`: a hash of the two, so it
    depends on neither the process nor the order games are played in."""
    return zlib.crc32(f"{group_id}#{index}".encode()) % n


def snapshot_dir(folder: Path, step: int) -> Path:
    return Path(folder) / f"{PREFIX}{step}"


def snapshot_steps(folder: Path) -> list[int]:
    """The complete snapshots in `folder` (a `.tmp` being written is none), oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(p.name[len(PREFIX):]) for p in folder.iterdir()
                  if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit())


def write_snapshot(folder: Path, step: int, save: Callable[[Path], None]) -> Path:
    """`save(path)` writes the policy's weights as a model folder; written whole or not at all."""
    path = snapshot_dir(folder, step)
    write_folder_atomic(path, save)  # makes the folder
    return path


def prune(folder: Path, keep: set[int]) -> list[int]:
    """Remove the snapshots not in `keep` (and any half-written one); the steps removed."""
    gone = [s for s in snapshot_steps(folder) if s not in keep]
    for s in gone:
        shutil.rmtree(snapshot_dir(folder, s), ignore_errors=True)
    for tmp in Path(folder).glob("*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    return gone


def drop_after(folder: Path, step: int) -> list[int]:
    """A resume at `step`: the snapshots the stopped run wrote past it go (its future, not the resumed run's)."""
    return prune(folder, {s for s in snapshot_steps(folder) if s <= step})


class OpponentPool:
    """The pool's models in one process that rolls out: `members(version)` loads the snapshots a rollout at `version`
    draws from (`load(name)`: a frozen model; step 0 is `base`, --model) and drops the ones that left."""

    kind = "pool"

    def __init__(self, folder: Path, *, base: str, every: int, size: int, load: Callable[[str], object]):
        self.folder, self.base, self.every, self.size, self.load = Path(folder), base, every, size, load
        self.loaded: dict[int, object] = {}

    def members(self, version: int) -> list[tuple[int, object]]:
        """(snapshot step, its model) for each snapshot a rollout at `version` draws from, oldest first."""
        steps = pool_steps(version, self.every, self.size)
        for s in [s for s in self.loaded if s not in steps]:
            del self.loaded[s]  # first: its memory goes before a newer one loads
        for s in steps:
            if s not in self.loaded:
                path = snapshot_dir(self.folder, s)
                if s and not path.is_dir():
                    raise FileNotFoundError(f"--opponent pool: snapshot {path} is missing (the learner writes it "
                                            f"before the weights of version {s} reach any rollout)")
                self.loaded[s] = self.load(self.base if s == 0 else str(path))
        return [(s, self.loaded[s]) for s in steps]
