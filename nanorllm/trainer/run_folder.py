"""RunFolder: the scaffold every training program stands on (RL's loop, SFT, reward-model fitting).

    folder = RunFolder.open(output_dir, run_name, resume=..., default_name=run_name_now(exp, seed))
    policy = load_trainable(cfg, device, resumed=folder.resumed_model)  # a resume: the checkpoint's weights
    folder.open_sinks(report_to, config)        # TensorBoard / metrics.jsonl / wandb, cut back on resume
    folder.write_config(saved)                  # config.json, atomically
    ... the program's own loop, checkpoint.save(folder.path, ...) ...
    folder.close()                              # the sinks, then the lock: last

Opening takes the folder's lock (trainer/runlock.py) before anything in it is read, cleaned or written: two
processes on one folder are refused. A resume then clears what a process that died mid-write left and loads
the newest checkpoint that passes its manifest (trainer/checkpoint.py); a new run refuses a folder that
already holds something, so no run writes over another's checkpoints and event files.
"""

import itertools
import json
from datetime import datetime
from pathlib import Path

from nanorllm.config.errors import ConfigError
from nanorllm.config.fields import DTYPE_CHOICE
from nanorllm.trainer import checkpoint
from nanorllm.trainer.runlock import LOCK_NAME, RunLock
from nanorllm.utils.files import write_atomic
from nanorllm.utils.logger import RunLogger
from nanorllm.utils.sinks import parse_report_to


def run_name_now(*parts: str | int) -> str:
    """A run's default folder name: its parts and the time it started, `a__b__20261206-051500`."""
    return "__".join([*map(str, parts), datetime.now().strftime("%Y%m%d-%H%M%S")])


def first_choice(run_dir: Path, dtype: str) -> str | None:
    """The dtype choice config.json already records for `dtype` (a resumed run keeps why its start chose it)."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return saved.get(DTYPE_CHOICE) if isinstance(saved, dict) and saved.get("dtype") == dtype else None


def make(path: Path, *, claim: bool) -> tuple[Path, list[Path]]:
    """`path` made (absolute: a chdir moves none of it) with its missing parents, and the folders made, deepest first.
    `claim`: a folder that exists already is another run's, so `path-2`, `path-3`... is tried until one is made."""
    path = path.absolute()
    for n in itertools.count(1):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        created = [p for p in [candidate, *candidate.parents] if not p.exists()]
        try:
            candidate.mkdir(parents=True, exist_ok=not claim)
            return candidate, created
        except FileExistsError:
            continue


class RunFolder:
    def __init__(self, path: Path, lock: RunLock, *, created: list[Path]):
        self.path = path
        self.lock = lock
        self.created = created  # the folders (deepest first) this run made: closed with nothing written, they go
        self.ckpt: Path | None = None  # the checkpoint resumed from (None: a new run)
        self.state: dict | None = None  # its state (trainer/checkpoint.py `read`)
        self.logger: RunLogger | None = None  # open_sinks

    @classmethod
    def open(cls, output_dir: str, run_name: str | None, *, resume: str | None, default_name: str,
             say=print) -> "RunFolder":
        """The run's folder, made and locked: `resume` when given, else `output_dir/run_name`, else `default_name`
        under `output_dir` (`-2`, `-3`... appended when a run started in the same second took it: each name is
        claimed by the mkdir that makes it). Raises ConfigError when it cannot be made, RunFolderInUse when another
        process holds it, FileExistsError when a new run's folder is not empty, CheckpointError when a resume finds
        no checkpoint that loads."""
        given = resume or (Path(output_dir) / run_name if run_name else None)
        target = Path(given or Path(output_dir) / default_name).absolute()
        try:
            path, created = make(target, claim=not given)
        except OSError as e:
            raise ConfigError([f"output_dir: cannot create {target} ({type(e).__name__}: {e.strerror or e})"],
                              "--output-dir / --run-name") from None
        folder = cls(path, RunLock(path).acquire(), created=created)
        try:
            folder.load(resume is not None, say)
        except BaseException:
            folder.close()
            raise
        return folder

    def load(self, resume: bool, say) -> None:
        """A resume's newest checkpoint, after the leftovers of a write that died; a new run's empty folder."""
        if not resume:
            if any(p.name != LOCK_NAME for p in self.path.iterdir()):
                raise FileExistsError(f"{self.path} exists and is not empty; use --resume {self.path} "
                                      "to continue it or choose another --run-name")
            return
        for p in checkpoint.clean_stale(self.path):
            say(f"[resume] removed {p.name}, left by a process that died while writing it")
        self.ckpt, self.state = checkpoint.load_latest(self.path)

    @property
    def start_step(self) -> int:
        return self.state["step"] if self.state else 0

    @property
    def resumed_model(self) -> str | None:
        """The resumed checkpoint's model/ folder (the whole model, or under LoRA the adapters); None: a new run."""
        return str(self.ckpt / "model") if self.state else None

    def open_sinks(self, report_to: str, config: dict, *, dump_size: int = 512) -> RunLogger:
        """The run's sinks (utils/logger.py); on resume each is cut back to the checkpoint's step, so the steps
        trained again after it are not recorded twice."""
        purge = self.start_step + 1 if self.state else None
        self.logger = RunLogger(self.path, dump_size=dump_size, purge_step=purge,
                                report_to=parse_report_to(report_to), config=config)
        return self.logger

    def write_config(self, saved: dict) -> None:
        write_atomic(self.path / "config.json", json.dumps(saved, indent=2) + "\n")

    def close(self) -> None:
        """The sinks, then the lock: the run's last writes happen under it. A folder this run made and wrote nothing
        into (it stopped at bad input before its first write) is removed, with the folders made to hold it: nothing is
        left half-made."""
        if self.logger is not None:
            self.logger.close()
        unused = self.path in self.created and all(p.name == LOCK_NAME for p in self.path.iterdir())
        if unused:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
        self.lock.release()
        for folder in self.created if unused else []:
            try:
                folder.rmdir()  # made by this run, and empty
            except OSError:  # another run's folder came to sit beside it: the rest stays
                break


class InRunFolder:
    """A program's run (SFT's, a reward model's fit) that keeps its RunFolder as `folder`: its path and sinks under
    the names the loops use."""

    folder: RunFolder

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def logger(self) -> RunLogger:
        return self.folder.logger
