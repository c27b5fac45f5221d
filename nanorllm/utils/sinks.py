"""Where a run's scalars go besides (or instead of) TensorBoard: `--report-to jsonl` and `--report-to wandb`.

Every sink receives the same names RunLogger writes to TensorBoard, step by step:

- `JsonlSink`: `runs/<run>/metrics.jsonl`, one object per step ({"step": n, "reward/mean": ...}), for scripts
  and plots. The scalars of one step (the update's, the eval's) are gathered and written as one line when
  the next step begins or the run closes; a resumed run cuts the file back to its checkpoint.
- `WandbSink`: Weights & Biases (`pip install -e .[wandb]`, imported only here); the run's config is the W&B
  config, and `WANDB_MODE=offline` runs with no network (the run syncs later with `wandb sync`).
"""

import json
import os
from pathlib import Path

REPORTERS = ("tensorboard", "jsonl", "wandb")


def parse_report_to(text: str) -> tuple[str, ...]:
    """("tensorboard", "jsonl") from "tensorboard,jsonl"; ValueError names what is not a reporter."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in REPORTERS]
    if bad or not names:
        raise ValueError(f"expected a comma list of {', '.join(REPORTERS)}, got {text!r}")
    return tuple(dict.fromkeys(names))


class JsonlSink:
    def __init__(self, run_dir: Path, *, purge_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.step: int | None = None
        self.row: dict = {}
        if self.path.exists() and purge_step is not None:  # a resumed run: no step twice
            lines = [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
            kept = [line for line in lines if json.loads(line).get("step", 0) < purge_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def scalars(self, metrics: dict, step: int) -> None:
        if self.step is not None and step != self.step:
            self.flush()
        self.step = step
        self.row.update(metrics)

    def flush(self) -> None:
        if self.step is None or not self.row:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.step, **self.row}) + "\n")
        self.step, self.row = None, {}

    def close(self) -> None:
        self.flush()


class WandbSink:
    def __init__(self, run_dir: Path, *, config: dict | None = None, resume: bool = False):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "nanorllm"), name=Path(run_dir).name,
                              dir=str(run_dir), config=config or {}, resume="allow" if resume else None,
                              id=None)

    def scalars(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()
