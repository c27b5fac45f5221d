"""When and what a training run saves: a checkpoint every --save-every steps or --save-every-minutes, the last
completed step's at shutdown, final_model/ at the end, and under --opponent pool the policy's snapshots
(rollout/opponent_pool.py); trainer/checkpoint.py writes and reads the checkpoints."""

import errno
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nanorllm.config import TrainConfig
from nanorllm.datasets.stream import TaskStream
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import save_merged
from nanorllm.ranks.group import LearnerRanks, ShardsUnavailable
from nanorllm.rollout.opponent_pool import POOL_DIR, drop_after, kept_steps, prune, write_snapshot
from nanorllm.trainer import checkpoint
from nanorllm.trainer.source import RolloutSource
from nanorllm.utils.faults import fault
from nanorllm.utils.files import write_folder_atomic


@dataclass
class CheckpointSaver:
    """The saves of the run in `run_dir`, of its policy, optimizer state (through its ranks), task stream and totals."""
    cfg: TrainConfig
    run_dir: Path
    policy: HFCausalPolicy
    optimizer: torch.optim.Optimizer
    ranks: LearnerRanks
    stream: TaskStream
    task_order: dict | None  # the fingerprint checkpoints carry (trainer/fingerprint.py)
    totals: dict
    say: Callable[[str], None]
    source: RolloutSource | None = None  # while training: asked for the stream position of a step
    checkpoint_step: int | None = None  # the last checkpoint's (a resume's own, then each one written)
    last_save_t: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.checkpoint_step is not None and self.cfg.opponent == "pool":  # a resume: the stopped run's snapshots
            drop_after(self.run_dir / POOL_DIR, self.checkpoint_step)  # past its checkpoint are not this run's

    def save(self, step: int) -> Path:
        optimizer_state = self.ranks.optimizer_state(self.policy, self.optimizer)  # first: it may be refused
        position = self.source.position_at(step) if self.source else self.stream.position
        path = checkpoint.save(self.run_dir, step, config=self.cfg.saved(), keep=self.cfg.keep_checkpoints,
                               policy=self.policy, optimizer_state=optimizer_state, stream_position=position,
                               stream_origin=self.stream.origin, task_order=self.task_order, totals=self.totals,
                               sampler=self.stream.state())
        self.last_save_t = time.monotonic()
        self.checkpoint_step = step
        self.say(f"[checkpoint] {path}")
        return path

    def pool_snapshot(self, version: int) -> None:
        """--opponent pool: the policy's weights at `version` join the pool when due, before they reach any rollout,
        and the snapshots no rollout and no resume can still ask for go."""
        cfg = self.cfg
        if cfg.opponent != "pool" or version % cfg.pool_every:
            return
        folder = self.run_dir / POOL_DIR
        write_snapshot(folder, version, self.write_model)
        prune(folder, kept_steps(version, lag=0 if cfg.serial else cfg.max_policy_lag,
                                 checkpoints=checkpoint.complete_steps(self.run_dir), every=cfg.pool_every,
                                 size=cfg.pool_size))

    def write_model(self, path: Path) -> None:
        """The policy as a plain model folder any process loads with --model's loader (LoRA merged)."""
        if self.policy.peft is not None:
            save_merged(self.policy.model, self.policy.tokenizer, path)
        else:
            self.policy.model.save_pretrained(str(path))
            self.policy.tokenizer.save_pretrained(str(path))

    def when_due(self, step: int) -> None:
        """A checkpoint every --save-every steps, or when --save-every-minutes passed since the last one."""
        cfg = self.cfg
        minutes = (time.monotonic() - self.last_save_t) / 60
        if ((cfg.save_every and step % cfg.save_every == 0)
                or (cfg.save_every_minutes and minutes >= cfg.save_every_minutes)):
            with self.ranks.guarded():  # FSDP: the ranks gather the optimizer state
                self.periodic(step)

    def periodic(self, step: int) -> Path | None:
        """A periodic checkpoint; one the disk refuses (full, quota) is reported and tried again at the
        next save point while the run goes on: its weights are still in memory."""
        try:
            return self.save(step)
        except OSError as e:
            self.last_save_t = time.monotonic()
            saved = checkpoint.list_complete(self.run_dir)
            print(f"[checkpoint] step {step} not written ({type(e).__name__}: {e}); the run goes on and tries again "
                  f"at the next save point; the last one on disk is {saved[-1].name if saved else 'none'}", flush=True)
            return None

    def last(self, step: int, *, dirty: bool) -> Path | None:
        """Checkpoint `step`, the last completed one, unless it is on disk already. Refused only when an error
        struck inside an optimizer step (`dirty`): those weights belong to no step."""
        if dirty:
            print("[checkpoint] not written: the run failed inside an optimizer step, so the weights match "
                  "no step; the previous checkpoint stands", flush=True)
            return None
        saved = {p.name: p for p in checkpoint.list_complete(self.run_dir)}
        try:
            return saved.get(f"{checkpoint.PREFIX}{step}") or self.save(step)
        except ShardsUnavailable as e:  # never a checkpoint with a partial optimizer state
            stands = list(saved)[-1] if saved else "none: a resume starts from scratch"
            print(f"[checkpoint] step {step} not written: {e}; the previous checkpoint stands ({stands})", flush=True)
            return None

    def final_model(self) -> None:
        """final_model/ (with merged/ inside under LoRA) written as `final_model.tmp/` and renamed once whole, as a
        checkpoint is: a crash or a full disk mid-write leaves no final_model/ that looks complete (a resume's
        clean_stale removes the .tmp)."""
        def write(tmp: Path) -> None:
            self.policy.save(str(tmp))
            if fault("disk_full") == "final":
                raise OSError(errno.ENOSPC, "No space left on device (injected fault: disk_full final)")
            if self.policy.peft is not None and self.cfg.lora_merged:
                save_merged(self.policy.model, self.policy.tokenizer, tmp / "merged")

        write_folder_atomic(self.run_dir / "final_model", write)
