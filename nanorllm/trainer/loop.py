"""TrainingRun: setup -> train -> cleanup, the same for the serial loop and the pipeline's learner.

The only thing that differs between the two modes is where a step's episodes come from, a
`RolloutSource` (trainer/source.py). This file is the loop and its setup; the order of it all, and the shutdown,
is lifecycle.py.

    for step in range(start, max_steps):
        results = source.next_batch(step)   # generate (here or in workers)
        metrics = train_step(...)           # group, advantage, collate, loss, optimizer step
        source.after_update(step)           # publish weights (pipeline) / nothing (serial)
        log, evaluate, checkpoint

What the loop calls lives beside it: the alarms look at each step's episodes once (`Monitors`, monitors.py),
held-out evaluation is `HeldOutEval` (held_out.py), the saves `CheckpointSaver` (saving.py), the checks
setup_checks.py and train_checks.py, and the stop state the signal handler reads `StopState` (signals.py).

Stopping at any moment keeps a checkpoint exact: from the optimizer step to the end of the step's
logs the run is `committing` (a stop signal waits for it, it takes milliseconds); before the
optimizer step a stop abandons the step and the weights are still those of the last completed one.
"""

import random
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from nanorllm.config import TrainConfig, format_config
from nanorllm.config.fields import DTYPE_CHOICE
from nanorllm.config.specs import sampler_spec
from nanorllm.core.types import RolloutResult
from nanorllm.datasets.sampler import SignalSampler, group_outcomes, make_stream
from nanorllm.datasets.stream import TaskStream
from nanorllm.envs.registry import describe
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import trainable_line, trainable_parameters
from nanorllm.ranks.group import ONE_RANK, LearnerRanks, where_line
from nanorllm.trainer import checkpoint, fingerprint
from nanorllm.trainer.held_out import HeldOutEval
from nanorllm.trainer.metrics import rollout_metrics
from nanorllm.trainer.monitors import Monitors
from nanorllm.trainer.parity import startup_parity_line
from nanorllm.trainer.parts import RunParts
from nanorllm.trainer.reference import reference_policy
from nanorllm.trainer.run_folder import RunFolder, first_choice, run_name_now
from nanorllm.trainer.saving import CheckpointSaver
from nanorllm.trainer.setup_checks import check_prompt_lengths, check_resumable
from nanorllm.trainer.signals import StopState
from nanorllm.trainer.source import RolloutSource
from nanorllm.trainer.step import train_step
from nanorllm.trainer.step_metrics import console_line, derived_metrics
from nanorllm.trainer.teacher import Teacher, load_teacher
from nanorllm.trainer.train_checks import check_finite_weights, check_trained, count_untrained
from nanorllm.trainer.trainable import load_trainable
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.devices import DeviceMap, configure_threads
from nanorllm.utils.faults import before_update
from nanorllm.utils.logger import RunLogger
from nanorllm.utils.startup import StartupClock


def default_run_name(cfg: TrainConfig) -> str:
    return run_name_now("arith" if cfg.tasks.startswith("arith") else Path(cfg.tasks).stem, cfg.exp_name, cfg.seed)


class TrainingRun:
    HISTORY = 1000

    def __init__(self, cfg: TrainConfig, *, resume_dir: str | None = None, overrides: dict | None = None,
                 quiet: bool = False, clock: StartupClock | None = None):
        self.cfg = cfg
        self.clock = clock or StartupClock()  # the start-up's phases (utils/startup.py): setup laps its own
        self.quiet = quiet  # no console output (timed trials print their own summary)
        self.resume_dir = resume_dir
        self.overrides = overrides or {}
        self.start_step = 0
        self.final_step = 0
        self.stop = StopState()  # what the stop signals read (trainer/signals.py)
        self.source: RolloutSource | None = None
        self.history: list[dict] = []  # the last HISTORY steps' metrics, for benchmarks and tuning
        self.totals = {"skipped_nan": 0, "dropped_heldout": 0, "env_error_steps": 0}
        self.ranks: LearnerRanks = ONE_RANK  # this process is learner rank 0 of ranks.world
        # Made by setup(), in this order:
        self.parts: RunParts | None = None  # the run's assembly: env, tasks, devices, LoRA spec
        self.devices: DeviceMap | None = None
        self.train_tasks: list[dict] = []
        self.eval_tasks: list[dict] = []
        self.task_order: dict | None = None  # the fingerprint checkpoints carry (trainer/fingerprint.py)
        self.folder: RunFolder | None = None  # locked from before it is touched until cleanup's end
        self.run_dir: Path | None = None  # the folder's path
        self.policy: HFCausalPolicy | None = None
        self.ref_policy = None  # only with kl_coef > 0: a frozen copy, or under LoRA the adapters off (reference.py)
        self.teacher: Teacher | None = None  # only with --teacher: the frozen model distilled from (teacher.py)
        self.optimizer: torch.optim.Optimizer | None = None
        self.stream: TaskStream | None = None
        self.monitors: Monitors | None = None  # the grader, tool and collapse alarms
        self.saver: CheckpointSaver | None = None
        self.logger: RunLogger | None = None  # the folder's sinks; None: nothing written yet, nothing to save
        self.held_out: HeldOutEval | None = None

    # ---- setup -----------------------------------------------------------------------------
    def setup(self, parts: RunParts, ranks: LearnerRanks) -> None:
        """Everything before the first rollout that the loop owns (the model, the optimizer, the run folder, the
        resume, the logs), from the run's assembled `parts` (env, tasks, devices, LoRA spec: run/assembly.py),
        as rank 0 of `ranks` (started by the caller: run/ranks.py; the other ranks load meanwhile)."""
        self.parts, self.devices, self.ranks = parts, parts.devices, ranks
        self.cfg = cfg = parts.cfg  # its task specs resolved
        self.use_cores(alone=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.env = parts.env
        self.train_tasks, self.eval_tasks = parts.train_tasks, parts.eval_tasks
        self.totals["dropped_heldout"], self.task_order = parts.dropped_heldout, parts.task_order
        self.folder = RunFolder.open(cfg.output_dir, cfg.run_name, resume=self.resume_dir, say=self.say,
                                     default_name=default_run_name(cfg))  # locked before it is read or written
        self.run_dir, state = self.folder.path, self.folder.state
        if state:
            check_resumable(cfg, state, self.task_order, self.run_dir)
        self.load_model()
        self.ref_policy = reference_policy(self.policy, cfg, self.devices.learner,
                                           cfg.model if not state else state["reference_model"])
        self.teacher = load_teacher(cfg, self.devices.learner)
        self.optimizer = make_optimizer(self.policy, cfg)
        self.optimizer.register_step_pre_hook(self.stop.updating)
        self.stream = make_stream(self.train_tasks, seed=cfg.seed, spec=sampler_spec(cfg))
        if state:
            self.resume(state)
        self.final_step = self.start_step
        self.monitors = Monitors(cfg, tokenizer=self.policy.tokenizer, start_step=self.start_step,
                                 totals=self.totals, say=self.say)
        self.ranks.broadcast({"cfg": cfg, "env_spec": parts.env_spec, "lora": parts.lora,
                              "processes": self.processes(), "start_step": self.start_step,
                              "reference_model": cfg.model if not state else state["reference_model"]})
        self.open_logs(state)
        self.clock.lap("setup")  # reference, teacher, optimizer, resume, run folder and logs

    def load_model(self) -> None:
        """The trained policy on the learner's device, its prompts checked against its room, its sampler against
        the learner (parity)."""
        cfg = self.cfg
        if self.devices.learner.startswith("cuda"):  # as every worker and rank does: allocations we do not
            torch.cuda.set_device(self.devices.learner)  # place, and streams, land on the learner's GPU
        self.policy = load_trainable(cfg, device=self.devices.learner, lora=self.parts.lora,
                                     resumed=self.folder.resumed_model)
        self.policy.graphs_enabled = cfg.cuda_graphs
        self.clock.lap("model")
        self.say(trainable_line(self.policy))
        kept = check_prompt_lengths(cfg, self.policy, self.env, {"training": self.train_tasks,
                                                                 "held-out": self.eval_tasks}, self.say)
        self.train_tasks, self.eval_tasks = kept["training"], kept["held-out"]
        self.clock.lap("checks")
        self.say(startup_parity_line(self.policy, temperature=cfg.temperature))  # stops a run that would train on noise
        self.clock.lap("parity")

    def resume(self, state: dict) -> None:
        """The checkpoint's optimizer, RNGs, task stream and totals back, under this config's learning rate."""
        self.start_step = checkpoint.restore(state, policy=self.policy, optimizer=self.optimizer,
                                             stream=self.stream, totals=self.totals)
        for group in self.optimizer.param_groups:  # the saved optimizer state carries the old ones
            group.update(lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        if fingerprint.order_changes(state.get("task_order"), self.task_order):  # accepted: a new epoch
            self.stream.origin = self.stream.position
            self.say(f"[resume] new task order accepted (--resume-new-data): epoch 0 of it starts at task-stream "
                     f"position {self.stream.position}")

    def open_logs(self, state: dict | None) -> None:
        """The folder's sinks and the run's opening lines; the saves and held-out evals write there; config.json
        last (setup succeeded)."""
        cfg = self.cfg
        self.logger = self.folder.open_sinks(cfg.report_to, cfg.saved(), dump_size=cfg.rollout_dump_size)
        self.say(format_config(cfg).replace("|-|-|\n", ""))
        self.say(describe(self.env))
        self.say(f"[precision] {cfg.dtype}: {self.parts.precision}")
        if self.overrides:
            self.say(f"[resume] overriding the saved config with: {self.overrides}")
        self.say(f"[run] {self.run_dir} | train tasks {len(self.train_tasks)} (held-out removed: "
                 f"{self.totals['dropped_heldout']}) | eval tasks {len(self.eval_tasks)} | devices {self.devices}")
        if not state:
            self.logger.text("hyperparameters", format_config(cfg), 0)
        self.saver = CheckpointSaver(cfg, self.run_dir, self.policy, self.optimizer, self.ranks, self.stream,
                                     self.task_order, self.totals, self.say,
                                     checkpoint_step=self.start_step if state else None)
        self.held_out = HeldOutEval(cfg, self.policy, self.env, self.eval_tasks, self.parts.eval_sets, self.logger,
                                    self.run_dir, self.say)
        saved = {**cfg.saved(), DTYPE_CHOICE: first_choice(self.run_dir, cfg.dtype) or self.parts.precision}
        self.folder.write_config(saved)

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)

    def use_cores(self, *, alone: bool) -> None:
        """`--threads` where given, always; else all CPU cores while this process runs alone (setup,
        evaluation before and after training, the serial loop), its share while worker processes run
        beside it."""
        alone = alone or self.cfg.serial
        configure_threads(self.devices.learner, self.cfg.threads, 1 if alone else self.processes())

    def processes(self) -> int:
        """Processes of this run on this machine: its workers and its learner ranks."""
        return len(self.devices.workers) + self.ranks.local_world

    # ---- the loop --------------------------------------------------------------------------
    def train(self, source: RolloutSource, on_step: Callable[["TrainingRun", int], None] | None = None) -> dict:
        """Steps start_step .. max_steps - 1 on `source`'s episodes, until done or stopped; `on_step(run, n)`
        after step n is on record (logged, checkpointed when due)."""
        cfg = self.cfg
        self.source = self.saver.source = source  # checkpoints ask it for the stream position
        if where := self.ranks.attach(self.policy, self.optimizer):  # every rank gets rank 0's weights and optimizer
            self.say(where_line(where))  # state (after the workers' shared block: DDP's replica is what they read)
        bar = tqdm(range(self.start_step, cfg.max_steps), desc="train", dynamic_ncols=True, leave=False,
                   disable=self.quiet)
        for step in bar:
            if self.stop.requested:
                break
            t0 = time.perf_counter()
            with self.ranks.guarded():  # a dead or silent rank: one error that names it
                results, metrics = self.rollout(step)  # this step's episodes and their scalars
                if results is None:
                    break
                metrics.update(self.learn(results, step))  # group -> advantage -> flatten -> collate -> loss -> step
            metrics.update(self.publish(step, results))  # the sampler learns, the new weights go to the workers
            self.record(step + 1, results, metrics, t0, bar)  # totals, logs, console, checkpoint when due
            if on_step is not None:
                on_step(self, step + 1)
            if self.stop.requested:
                break
            check_trained(cfg, self.totals, self.final_step, at_end=False)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.max_steps:
                self.held_out.evaluate(step + 1)
        bar.close()
        self.end_loop()
        return {"step": self.final_step}

    def rollout(self, step: int) -> tuple[list[RolloutResult] | None, dict]:
        """Step `step`'s episodes from the source, every learner rank starting the step with it, and their
        scalars; the grader, tool and collapse alarms look at them. (None, {}) when the run stops instead."""
        self.ranks.begin(step)  # the other ranks start it too (and other nodes' leaders their rollouts)
        results, extra = self.source.next_batch(step)
        if self.stop.requested or results is None:
            return None, {}
        metrics = rollout_metrics(results, env=self.env)
        metrics.update(extra)
        self.monitors.watch(results, metrics, step + 1)
        return results, metrics

    def learn(self, results: list[RolloutResult], step: int) -> dict:
        """The update on this rank's share of the step's episodes (trainer/step.py), between the fault suite's
        hook and the check that the new weights are finite."""
        before_update(step + 1, trainable_parameters(self.policy.model))  # the fault suite's hook (inert)
        share = self.ranks.share(results, self.policy.version)  # all of it with one rank
        metrics = train_step(self.policy, self.optimizer, share, self.cfg, ref_policy=self.ref_policy,
                             teacher=self.teacher, ranks=self.ranks,  # rae's baselines: in the checkpoints' totals
                             role_baselines=self.totals.setdefault("role_baselines", {}))
        check_finite_weights(self.policy.model, step + 1)  # else the run stops dirty: no checkpoint of them
        return metrics

    def publish(self, step: int, results: list[RolloutResult]) -> dict:
        """From here the step is being committed: the task sampler learns its outcomes, the new weights join the
        opponent pool when due, then the source does its work after an update (publishing the weights; the pipeline
        draws later steps, from the new estimates)."""
        self.stop.committing = True  # already set by the optimizer's hook, unless the update was skipped
        self.saver.pool_snapshot(step + 1)  # before any rollout can sample at the new version
        return {**self.observe(results), **self.source.after_update(step)}

    def observe(self, results: list[RolloutResult]) -> dict:
        """The signal sampler's estimates take the step's groups (failed episodes left out); its sampler/* scalars.
        Only a committed step's: a step abandoned before its update is drawn again on resume, from these."""
        return self.stream.observe(group_outcomes(results)) if isinstance(self.stream, SignalSampler) else {}

    def record(self, step: int, results: list[RolloutResult], metrics: dict, t0: float, bar) -> None:
        """Step `step` on record: the run's totals, the derived scalars, the logs, the console line and a
        checkpoint when one is due."""
        self.final_step = step
        self.stop.dirty = False
        count_untrained(self.totals, results, metrics)
        metrics.update(derived_metrics(metrics, results, step_s=time.perf_counter() - t0,
                                       skipped_nan_total=self.totals["skipped_nan"]))
        self.logger.scalars(metrics, step)
        self.history.append(metrics)
        del self.history[:-self.HISTORY]  # bounded: a week-long run must not grow
        sample_every = self.cfg.sample_every
        self.logger.episodes(results, step, log_text=sample_every > 0 and step % sample_every == 0)
        if not self.quiet:
            bar.write(console_line(step, self.cfg.max_steps, metrics))
        self.saver.when_due(step)
        self.stop.committing = False  # the step is on record; an eval may be interrupted

    def end_loop(self) -> None:
        """After the last step: a run that reached max_steps is checked for having trained; the learner ranks go
        (FSDP saves the last checkpoint first, while they can gather its optimizer state)."""
        if not self.stop.requested and self.final_step == self.cfg.max_steps:
            self.monitors.finished(self.final_step)  # a run shorter than --tool-alarm-steps
            check_trained(self.cfg, self.totals, self.final_step, at_end=True)
        if self.ranks.parallel == "fsdp":
            self.save_last()
        self.ranks.release()

    # ---- the end ---------------------------------------------------------------------------
    def save_last(self) -> Path | None:
        """Checkpoint the last completed step, unless it is on disk already or the run failed inside an update."""
        return self.saver.last(self.final_step, dirty=self.stop.dirty)

    def finish(self) -> dict:
        """After a run that completed: final eval and final model. Returns eval.json's content."""
        self.held_out.write_summary(None, self.held_out.evaluate(self.final_step))
        if self.cfg.save_model:
            self.saver.final_model()
        self.logger.flush()
        return self.held_out.summary()

    def cleanup(self) -> None:
        if self.folder is not None:
            self.folder.close()  # the sinks, then the lock: the run's final writes happen under it

