"""Where a step's episodes come from: the one thing serial and pipeline mode do differently.

`RolloutSource` names what the training loop asks of either. `SerialSource` runs the RolloutEngine
in the training process; the pipeline's (pipeline/learner.py) takes finished episode batches off
the workers' queue. lifecycle.py's `make_source` picks one.
"""

import time
from pathlib import Path
from typing import Callable, Iterator, Protocol

from nanorllm.algos.advantages import silent_groups
from nanorllm.algos.groups import drop_failed, group_by_task_id
from nanorllm.config import TrainConfig
from nanorllm.core.types import RolloutBatch, RolloutResult
from nanorllm.datasets.stream import TaskStream
from nanorllm.envs.base import EnvBundle
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.training_engine import training_engine
from nanorllm.rollout.engine import EXAMPLE_TASK
from nanorllm.trainer.metrics import decode_metrics
from nanorllm.trainer.watchdog import Watchdog

SERIAL_HANG_S = 600.0  # a serial rollout without progress this long is hung, unless --worker-timeout-s says


def rollout_seed(cfg: TrainConfig, step: int) -> int:
    """Sampling seed of one step's batch: the same in serial and pipeline mode."""
    return cfg.seed * 1_000_003 + step


def fill_seed(cfg: TrainConfig, step: int, round_: int) -> int:
    """Sampling seed of fill_batch's extra round `round_` (1, 2, ...) of a step; the pipeline adds its job part."""
    return rollout_seed(cfg, step) + 7919 * 1_000_000 * round_


def mixed_groups(cfg: TrainConfig, results: list[RolloutResult]) -> int:
    """Groups with a learning signal, as the update will see them: on the episodes left after drop_failed, by
    the update's own test (algos/advantages.py carries_signal)."""
    groups = group_by_task_id(drop_failed(results, cfg.min_group_size)[0])
    return len(groups) - len(silent_groups(groups, turn_credit=cfg.turn_credit, turn_gamma=cfg.turn_gamma))


class FillRounds:
    """DAPO dynamic sampling's round loop, the one both sources drive: rounds of as many new tasks as groups with a
    signal (`mixed_groups`) are missing, drawn in stream order (a resume redraws them from the step's position,
    with the same seeds; the signal sampler draws none of the step's tasks again), until the step has
    tasks_per_step of them or has drawn fill_batch_cap x tasks_per_step tasks.

        fill = FillRounds(cfg, stream, step, first_results)
        for round_, picked, seed in fill.rounds():   # picked: [(task, group_id)]
            fill.add(<the episodes of picked, sampled with seed>)
        fill.metrics()
    """

    def __init__(self, cfg: TrainConfig, stream: TaskStream, step: int, first: list[RolloutResult]):
        self.cfg, self.stream, self.step = cfg, stream, step
        self.need, self.cap = cfg.tasks_per_step, int(cfg.fill_batch_cap * cfg.tasks_per_step)
        self.drawn, self.mixed = self.need, mixed_groups(cfg, first)
        self.taken = {r.task_id for r in first}  # the step's tasks so far

    def rounds(self) -> Iterator[tuple[int, list[tuple[dict, str]], int]]:
        """(round 1, 2, ..., its tasks, its sampling seed) while mixed groups are missing and the cap allows."""
        round_ = 0
        while self.mixed < self.need and self.drawn < self.cap:
            round_ += 1
            picked = self.stream.take(min(self.need - self.mixed, self.cap - self.drawn), avoid=self.taken)
            self.taken |= {t["task_id"] for t, _ in picked}
            self.drawn += len(picked)
            yield round_, picked, fill_seed(self.cfg, self.step, round_)

    def add(self, results: list[RolloutResult]) -> None:
        """A round's episodes came back."""
        self.mixed += mixed_groups(self.cfg, results)

    def metrics(self) -> dict:
        """The step's scalars: the tasks drawn beyond tasks_per_step and the share of the wanted mixed groups got."""
        return {"rollout/extra_groups": self.drawn - self.cfg.tasks_per_step,
                "rollout/fill_rate": self.mixed / self.cfg.tasks_per_step}


class RolloutSource(Protocol):
    capture_s: float  # the longest decode-graph capture its engines took before they were ready (0: none)

    def wait_ready(self, stop: Callable[[], bool]) -> None:
        """Return once batches can be made (workers loaded), or when `stop()` says so."""

    def next_batch(self, step: int) -> tuple[list[RolloutResult] | None, dict]:
        """Step `step`'s episodes and the source's metrics; (None, {}) when a stop cut the wait short."""

    def after_update(self, step: int) -> dict:
        """The update of `step` is done: the policy is version step + 1 (published, for workers)."""

    def position_at(self, step: int) -> int:
        """Task-stream position before `step`'s tasks were drawn (the checkpoint's exactly-once ledger)."""

    def close(self) -> None:
        """Stop whatever the source started."""


class SerialSource:
    """Rollouts in the training process: generate, then train, one after the other."""

    def __init__(self, cfg: TrainConfig, policy: HFCausalPolicy, stream: TaskStream, env: EnvBundle, *,
                 pool_dir: Path | None = None):
        """`pool_dir`: --opponent pool's snapshots (<run>/pool)."""
        self.cfg, self.policy, self.stream = cfg, policy, stream
        self.engine = training_engine(policy, cfg, env, pool_dir=pool_dir)
        # the KV cache's size printed (or refused) and, on a GPU, its graphs captured
        self.capture_s = self.engine.prepare(EXAMPLE_TASK, cfg.tasks_per_step * cfg.num_samples_per_task) or 0.0
        self.drawn_at = (None, None)  # (step, task-stream position before its tasks were drawn)

    def wait_ready(self, stop: Callable[[], bool]) -> None:
        pass

    def next_batch(self, step: int) -> tuple[list[RolloutResult], dict]:
        self.drawn_at = (step, self.stream.position)
        picked = self.stream.take(self.cfg.tasks_per_step)
        t0 = time.perf_counter()
        tasks = [t for t, _ in picked]
        # the pipeline's workers have a heartbeat; here the same limit stops a decode step or an env call
        # that never returns (Hung: exit 1, the last completed step saved)
        limit = self.cfg.worker_timeout_s or SERIAL_HANG_S
        with Watchdog("serial rollout", limit, env_name=self.engine.env.spec) as dog:
            dog.follow(self.engine, tasks)
            out = self.engine.run(tasks, num_samples=self.cfg.num_samples_per_task,
                                  group_ids=[g for _, g in picked], seed=rollout_seed(self.cfg, step))
            outs, extra = [out], {}
            if self.cfg.fill_batch:  # each extra round's tasks are the ones a hang report names
                outs, extra = self.fill(step, out, follow=lambda round_tasks: dog.follow(self.engine, round_tasks))
        rollout_s = time.perf_counter() - t0
        gen_tokens = sum(o.timings["gen_tokens"] for o in outs)
        return [r for o in outs for r in o.results], {
            "perf/rollout_s": rollout_s, "perf/gen_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
            **decode_metrics([o.timings for o in outs]), **extra}

    def fill(self, step: int, first: RolloutBatch, *, follow: Callable[[list[dict]], None] = lambda tasks: None
             ) -> tuple[list[RolloutBatch], dict]:
        """DAPO dynamic sampling (FillRounds), each round one engine call. Constant groups stay in the batch (its
        reward scalars) and the update drops them."""
        fill, outs = FillRounds(self.cfg, self.stream, step, first.results), [first]
        for _, picked, seed in fill.rounds():
            follow([t for t, _ in picked])
            outs.append(self.engine.run([t for t, _ in picked], num_samples=self.cfg.num_samples_per_task,
                                        group_ids=[g for _, g in picked], seed=seed))
            fill.add(outs[-1].results)
        return outs, fill.metrics()

    def after_update(self, step: int) -> dict:
        self.policy.version = step + 1
        return {}

    def position_at(self, step: int) -> int:
        drawn_step, position = self.drawn_at  # a step stopped mid-rollout has drawn its tasks already
        return position if drawn_step == step else self.stream.position

    def close(self) -> None:
        self.engine.close()  # an --agent run's endpoint
