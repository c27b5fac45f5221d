"""One training run from a config to its end: what `launch/train.py`, the trials and the learning
benchmark all call, so the order below is written once.

    assembly               env, tasks, devices, LoRA spec: built once (run/assembly.py), then the memory plan
    setup                  learner ranks, model, optimizer, resume, logs
    rollout source         --serial: an engine here; otherwise the workers start loading now ...
    held-out eval, step 0  ... while this runs (they are handed no job before the first batch)
    wait for the source    every worker has loaded its model
    the loop               TrainingRun.train
    shutdown               save the last completed step (workers may still be running), stop the
                           workers, stop the learner ranks
    final eval             only for a run that trained every step (and final_model/), then the logs close

Ctrl-C / SIGTERM / SIGHUP (signals.py): the step in progress is abandoned (or, if its optimizer step
has begun, seen through), the shutdown runs, exit code 130 / 143 / 129. An error: the traceback, the
same shutdown, exit code 1. Bad input (task file, config, checkpoint, a resume that changes the model
or the task order, devices, a run folder another process holds, LoRA targets the model lacks): exit code 2
before anything is written (the run folder and its lock file aside). A memory plan that does not fit the
machine (nanorllm/memory/plan.py) is refused with exit 2 before even that, before any model loads.
"""

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from nanorllm.config import ConfigError, TrainConfig
from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.base import EnvBundle
from nanorllm.memory.plan import MemoryPlan, MemoryPlanError, check_plan, plan_run
from nanorllm.pipeline.learner import PipelineSource
from nanorllm.pipeline.messages import WorkerStart
from nanorllm.policy.lora import LoraError
from nanorllm.ranks.group import under_torchrun
from nanorllm.rollout.opponent_pool import POOL_DIR
from nanorllm.run.args import parse_train_args
from nanorllm.run.assembly import assemble
from nanorllm.run.ranks import follow_torchrun, start_learner
from nanorllm.run.warm_start import prompt_shape_warning
from nanorllm.trainer.checkpoint import CheckpointError
from nanorllm.trainer.loop import TrainingRun
from nanorllm.trainer.parts import RunParts
from nanorllm.trainer.signals import StopSignals
from nanorllm.trainer.source import RolloutSource, SerialSource
from nanorllm.trainer.train_checks import TrainedNothing
from nanorllm.utils.children import start_server
from nanorllm.utils.devices import DeviceError
from nanorllm.utils.modules import EnvSpecError
from nanorllm.utils.startup import StartupClock

SOURCE_PHASES = ("engine", "workers start", "workers load")  # RunOutcome.startup_s: the source's own start-up

BAD_INPUT = (TaskFileError, ConfigError, CheckpointError, FileExistsError, DeviceError, LoraError, MemoryPlanError,
             EnvSpecError)


@dataclass
class RunOutcome:
    exit_code: int
    """0 finished, 1 failed, 2 bad input, 130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP."""
    summary: dict = field(default_factory=dict)
    """What the final step returned (eval.json's content by default); {} unless the run finished."""
    run_dir: Path | None = None
    history: list[dict] = field(default_factory=list)
    """The metrics of the last steps (TrainingRun.HISTORY of them)."""
    startup_s: float = 0.0
    """Building the rollout source and waiting for it, less the held-out eval in between (its start-up phases)."""
    train_s: float = 0.0
    """The loop's wall time."""
    startup: dict = field(default_factory=dict)
    """Seconds by start-up phase, from the process's start (or run_training's call) to the first step, as its
    `[startup]` line prints them; `capture`: the decode graphs' capture, inside the engine or workers' phase."""


def make_source(run: TrainingRun) -> RolloutSource:
    """The one place that picks where episodes come from: this process (--serial) or the workers."""
    pool_dir = run.run_dir / POOL_DIR  # --opponent pool's snapshots
    if run.cfg.serial:
        return SerialSource(run.cfg, run.policy, run.stream, run.env, pool_dir=pool_dir)
    start = WorkerStart(run.cfg, run.parts.env_spec, run.parts.lora,  # the workers build the same env and adapters
                        pool_dir=str(pool_dir))
    return PipelineSource(start, run.policy, run.optimizer, stream=run.stream, workers=run.devices.workers,
                          ranks=run.ranks, start_step=run.start_step, stop=lambda: run.stop.requested)


def check_memory(parts: RunParts, *, quiet: bool = False) -> tuple[bool, MemoryPlan | None]:
    """(go on, the memory plan of the run assembled as `parts`), the plan printed (one line); MemoryPlanError
    if it does not fit. False: --memory-plan-only (the caller stops, exit 0). Before any model loads or
    anything is written."""
    plan = plan_run(parts)
    return check_plan(plan, parts.cfg.model, plan_only=parts.cfg.memory_plan_only, quiet=quiet), plan


def _attempt(what: str, fn: Callable[[], object]) -> None:
    """Run one shutdown action; an error in it is printed, never raised over the original one."""
    try:
        fn()
    except Exception:
        print(f"[shutdown] {what} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)


def run_training(cfg: TrainConfig, *, resume_dir: str | None = None, overrides: dict | None = None,
                 quiet: bool = False, evaluate_first: bool = True, checkpoints: bool = True,
                 on_step: Callable[[TrainingRun, int], None] | None = None,
                 finish: Callable[[TrainingRun], dict] | None = None, env: EnvBundle | None = None,
                 started: float | None = None) -> RunOutcome:
    """Train `cfg` (or continue the run in `resume_dir`, `overrides` changed) to its end.

    quiet: no console output but errors. evaluate_first: the held-out eval at step 0. checkpoints:
    False for a run whose folder is thrown away (benchmarks) -- no save at shutdown. on_step(run, n):
    called once before the first step (n = start step) and after each step n is on record. finish(run):
    what a finished run does once its workers are gone (default: final eval and final_model/). env: the run's
    bundle as the command line's checks built it (run/world.py), so it is not built again (None: built here).
    started: when the process began (utils/startup.py process_start), so the start-up line counts its imports."""
    plan = None
    clock = StartupClock(started)
    if started is not None:
        clock.lap("imports")  # the interpreter, torch and transformers, the flags and their checks
    try:
        parts = assemble(cfg, env=env)  # env, tasks, devices, LoRA spec: once, for the plan, the run and its workers
        if (warning := prompt_shape_warning(cfg)) is not None and not quiet:
            print(warning, file=sys.stderr, flush=True)
        if resume_dir is None:  # a resumed run was planned when it started
            go, plan = check_memory(parts, quiet=quiet)
            if not go:
                return RunOutcome(exit_code=0)
        clock.lap("assembly")
    except BAD_INPUT as e:
        print(f"error: {e}", file=sys.stderr)
        return RunOutcome(exit_code=2)
    if not parts.cfg.serial:
        start_server()  # the workers' imports run while the learner loads
    run = TrainingRun(parts.cfg, resume_dir=resume_dir, overrides=overrides, quiet=quiet, clock=clock)
    signals = StopSignals(run.stop)
    source, status, out = None, "failed", RunOutcome(exit_code=1)
    try:
        with signals.interruptible():  # until the loop is over: then nothing may interrupt the save
            run.setup(parts, start_learner(parts.cfg, parts.devices))  # the learner ranks this process is rank 0 of
            source = make_source(run)  # workers load while the eval runs
            clock.lap("workers start" if not parts.cfg.serial else "engine")
            if evaluate_first:
                run.held_out.before(run.start_step)
                clock.lap("eval")
            run.use_cores(alone=False)
            source.wait_ready(lambda: run.stop.requested)
            t_ready = time.perf_counter()
            if not parts.cfg.serial:
                clock.lap("workers load")
            out.startup_s = sum(clock.phases.get(p, 0.0) for p in SOURCE_PHASES)
            out.startup = dict(clock.phases, capture=source.capture_s)
            run.say(clock.line() + (f" (decode graphs captured in {source.capture_s:.1f})" if source.capture_s else ""))
            if on_step is not None:
                on_step(run, run.start_step)
            run.train(source, on_step)
            out.train_s = time.perf_counter() - t_ready
        status = "stopped" if run.stop.requested else "done"
    except BAD_INPUT as e:
        print(f"error: {e}", file=sys.stderr)
        status = "bad input"
    except KeyboardInterrupt:
        status = "stopped"
    except TrainedNothing as e:
        print(f"[failed] {e}", file=sys.stderr, flush=True)
    except torch.OutOfMemoryError:
        traceback.print_exc()
        print(f"[failed] out of memory at step {run.final_step + 1}; the plan was: {plan.table() if plan else 'none'}; "
              "shrink it with --lora-rank, --dtype bf16, --grad-checkpointing, --micro-batch-tokens, "
              "--max-batch-episodes, --num-workers", file=sys.stderr, flush=True)
    except BaseException:
        traceback.print_exc()
        print("[failed] the run stopped on the error above", file=sys.stderr, flush=True)
    # Shutdown: save first (workers may still be running), then stop the workers, then the rest.
    if checkpoints and run.logger is not None and status != "bad input":
        _attempt("saving the checkpoint", run.save_last)
    if source is not None:
        _attempt("stopping the workers", source.close)  # gone before the final eval takes every core
    _attempt("stopping the learner ranks", run.ranks.close)
    if status == "done":  # everything is saved: a signal may cut the final eval short
        try:
            with signals.interruptible():
                run.use_cores(alone=True)
                out.summary = (finish or TrainingRun.finish)(run)
        except KeyboardInterrupt:
            status = "stopped"
        except Exception:
            traceback.print_exc()
            status = "failed"
    _attempt("closing the logs", run.cleanup)
    signals.restore()
    out.run_dir, out.history = run.run_dir, run.history
    out.exit_code = {"done": 0, "failed": 1, "bad input": 2, "stopped": signals.exit_code}[status]
    if status == "stopped" and checkpoints and run.run_dir is not None:
        print(f"[stopped] checkpoint under {run.run_dir / 'checkpoints'}; continue with --resume {run.run_dir}")
    s = out.summary
    if status == "done" and "gain" in s and not quiet:  # a held-out set (not only --eval-set ones) before and after
        print(f"[done] {held_out_change(s)} | {run.run_dir}")
    return out


def held_out_change(summary: dict) -> str:
    """eval.json's success before and after, and their gain, for the last line; "n/a" where no episode was scored
    (null in eval.json)."""
    before, after, gain = summary["before"]["success_rate"], summary["after"]["success_rate"], summary["gain"]
    failed = summary["after"].get("failed", 0)
    return (f"held-out success {figure(before, '.3f')} -> {figure(after, '.3f')} ({figure(gain, '+.3f')}) on "
            f"{summary['after']['n']} tasks{f' ({failed} failed to score, left out)' if failed else ''}")


def figure(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main(argv: list[str], started: float | None = None) -> int:
    """`python launch/train.py ARGV`: the exit code. Under torchrun a rank other than 0 follows rank 0's run.
    started: when the process began, so the start-up line counts its imports (None: from run_training's call)."""
    if under_torchrun() and int(os.environ["RANK"]) > 0:
        return follow_torchrun(argv)
    try:
        cfg, resume_dir, overrides, env = parse_train_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_training(cfg, resume_dir=resume_dir, overrides=overrides, env=env, started=started).exit_code
