"""TrainingRun: setup -> train -> cleanup, the same for the serial loop and the pipeline's learner.

The only thing that differs between the two modes is where a step's episodes come from, a
`RolloutSource` (trainer/source.py). Everything after that (advantages, update, metrics, eval,
checkpoints) is this file; the order of it all, and the shutdown, is lifecycle.py.

    for step in range(start, max_steps):
        results = source.next_batch(step)   # generate (here or in workers)
        metrics = train_step(...)           # group, advantage, collate, loss, optimizer step
        source.after_update(step)           # publish weights (pipeline) / nothing (serial)
        log, evaluate, checkpoint

Stopping at any moment keeps a checkpoint exact: from the optimizer step to the end of the step's
logs the run is `committing` (a stop signal waits for it, it takes milliseconds); before the
optimizer step a stop abandons the step and the weights are still those of the last completed one.
"""

import errno
import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from nanorllm.algos.groups import group_by_task_id
from nanorllm.config import ConfigError, TrainConfig, format_config
from nanorllm.config.fields import DTYPE_CHOICE
from nanorllm.config.specs import sampler_spec, sampling_params
from nanorllm.core.types import RolloutResult
from nanorllm.datasets.sampler import SignalSampler, make_stream
from nanorllm.datasets.stream import TaskStream
from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.registry import describe
from nanorllm.policy.chat_render import tool_format
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import save_merged, trainable_line, trainable_parameters
from nanorllm.policy.tool_calls import call_like
from nanorllm.ranks.group import ONE_RANK, LearnerRanks, ShardsUnavailable, where_line
from nanorllm.rollout.prompt_budget import describe_long, long_prompts, no_room, prompt_limit
from nanorllm.trainer import checkpoint, fingerprint
from nanorllm.trainer.collapse import CollapseAlarm
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled, json_ready, success_gain
from nanorllm.trainer.metrics import grader_timeouts, rollout_metrics
from nanorllm.trainer.parity import startup_parity_line
from nanorllm.trainer.reference import reference_policy
from nanorllm.trainer.run_folder import RunFolder, run_name_now
from nanorllm.trainer.teacher import Teacher, load_teacher
from nanorllm.trainer.parts import RunParts
from nanorllm.trainer.source import RolloutSource
from nanorllm.trainer.step import train_step
from nanorllm.trainer.step_metrics import derived_metrics
from nanorllm.trainer.trainable import load_trainable
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.devices import DeviceMap, configure_threads
from nanorllm.utils.faults import before_update, fault
from nanorllm.utils.files import write_atomic, write_folder_atomic
from nanorllm.utils.startup import StartupClock
from nanorllm.utils.logger import RunLogger


def default_run_name(cfg: TrainConfig) -> str:
    return run_name_now("arith" if cfg.tasks.startswith("arith") else Path(cfg.tasks).stem, cfg.exp_name, cfg.seed)


class TrainedNothing(RuntimeError):
    """Too many of the run's updates trained nothing: it must not end as a finished run."""


class NonFiniteWeights(RuntimeError):
    """An update left a weight inf or NaN: nothing after it can be trained or saved."""


def check_finite_weights(model: torch.nn.Module, step: int) -> None:
    """One fused norm per trained parameter (a frozen LoRA base cannot change) and one sync per step; raises
    NonFiniteWeights naming the first bad tensor."""
    named = [(n, p) for n, p in trainable_parameters(model) if p.is_floating_point()]
    norms = torch._foreach_norm([p.detach() for _, p in named])
    finite = torch.isfinite(torch.stack([n.float() for n in norms]))
    if not bool(finite.all()):
        bad = named[int((~finite).nonzero()[0])][0]
        raise NonFiniteWeights(f"step {step}'s update left non-finite weights (first: {bad}); the run stops and the "
                               "last checkpoint, whose weights are finite, stands (try a smaller --lr)")


class TrainingRun:
    HISTORY = 1000
    EVAL_HANG_S = 600.0  # held-out eval without progress this long is hung, unless --worker-timeout-s says

    def __init__(self, cfg: TrainConfig, *, resume_dir: str | None = None, overrides: dict | None = None,
                 quiet: bool = False, clock: StartupClock | None = None):
        self.cfg = cfg
        self.clock = clock or StartupClock()  # the start-up's phases (utils/startup.py): setup laps its own
        self.quiet = quiet  # no console output (timed trials print their own summary)
        self.resume_dir = resume_dir
        self.overrides = overrides or {}
        self.start_step = 0
        self.stop_requested = False
        self.committing = False  # optimizer step .. end of the step's logs: a stop waits for it
        self.dirty = False  # optimizer step .. final_step moved: the weights match no step number
        self.final_step = 0
        self.source: RolloutSource | None = None  # while training: checkpoints ask it for the stream position
        self.history: list[dict] = []  # the last HISTORY steps' metrics, for benchmarks and tuning
        self.totals = {"skipped_nan": 0, "dropped_heldout": 0, "env_error_steps": 0}
        self.tool_calls_seen = 0.0  # --tools: calls per episode summed over this process's first steps
        self.tool_reply: str | None = None  # --tools: a raw response of the first step (None: no --tools step ran)
        self.tool_alarm_said = False
        self.call_like_seen = False  # --tools: a response of those steps held a call in some family's format
        self.collapse = CollapseAlarm(cfg.collapse_alarm_steps)  # one distinct answer a group for long: a warning
        self.ranks: LearnerRanks = ONE_RANK  # this process is learner rank 0 of ranks.world
        # Made by setup(), in this order:
        self.parts: RunParts | None = None  # the run's assembly: env, tasks, devices, LoRA spec
        self.devices: DeviceMap | None = None
        self.train_tasks: list[dict] = []
        self.eval_tasks: list[dict] = []
        self.eval_sets: dict[str, list[dict]] = {}  # --eval-set name=spec: evaluated, not removed from training
        self.task_order: dict | None = None  # the fingerprint checkpoints carry (trainer/fingerprint.py)
        self.folder: RunFolder | None = None  # locked from before it is touched until cleanup's end
        self.run_dir: Path | None = None  # the folder's path
        self.policy: HFCausalPolicy | None = None
        self.ref_policy = None  # only with kl_coef > 0: a frozen copy, or under LoRA the adapters off (reference.py)
        self.teacher: Teacher | None = None  # only with --teacher: the frozen model distilled from (teacher.py)
        self.optimizer: torch.optim.Optimizer | None = None
        self.stream: TaskStream | None = None
        self.logger: RunLogger | None = None  # the folder's sinks; None: nothing written yet, nothing to save
        self.last_save_t = time.monotonic()

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
        self.eval_sets = parts.eval_sets
        self.folder = RunFolder.open(cfg.output_dir, cfg.run_name, resume=self.resume_dir, say=self.say,
                                     default_name=default_run_name(cfg))  # locked before it is read or written
        self.run_dir, state = self.folder.path, self.folder.state
        if state:
            self.check_resumable(state)
        if self.devices.learner.startswith("cuda"):  # as every worker and rank does: allocations we do not
            torch.cuda.set_device(self.devices.learner)  # place, and streams, land on the learner's GPU
        self.policy = load_trainable(cfg, device=self.devices.learner, lora=parts.lora,
                                     resumed=self.folder.resumed_model)
        self.policy.graphs_enabled = cfg.cuda_graphs
        self.clock.lap("model")
        self.say(trainable_line(self.policy))
        self.check_prompt_lengths()
        self.clock.lap("checks")
        self.say(startup_parity_line(self.policy, temperature=cfg.temperature))  # stops a run that would train on noise
        self.clock.lap("parity")
        self.ref_policy = reference_policy(self.policy, cfg, self.devices.learner,
                                           cfg.model if not state else state["reference_model"])
        self.teacher = load_teacher(cfg, self.devices.learner)
        self.optimizer = make_optimizer(self.policy, cfg)
        self.optimizer.register_step_pre_hook(self._updating)
        self.stream = make_stream(self.train_tasks, seed=cfg.seed, spec=sampler_spec(cfg))
        if state:
            self.start_step = checkpoint.restore(state, policy=self.policy, optimizer=self.optimizer,
                                                 stream=self.stream, totals=self.totals)
            for group in self.optimizer.param_groups:  # the saved optimizer state carries the old ones
                group.update(lr=cfg.lr, weight_decay=cfg.weight_decay)
            if fingerprint.order_changes(state.get("task_order"), self.task_order):  # accepted: a new epoch
                self.stream.origin = self.stream.position
                self.say(f"[resume] new task order accepted (--resume-new-data): epoch 0 of it starts at task-stream "
                         f"position {self.stream.position}")
        self.final_step = self.start_step
        self.ranks.broadcast({"cfg": cfg, "env_spec": parts.env_spec, "lora": parts.lora,
                              "processes": self.processes(), "start_step": self.start_step,
                              "reference_model": cfg.model if not state else state["reference_model"]})
        self.logger = self.folder.open_sinks(cfg.report_to, cfg.saved(), dump_size=cfg.rollout_dump_size)
        self.say(format_config(cfg).replace("|-|-|\n", ""))
        self.say(describe(self.env))
        self.say(f"[precision] {cfg.dtype}: {self.parts.precision}")
        if self.overrides:
            self.say(f"[resume] overriding the saved config with: {self.overrides}")
        self.say(f"[run] {self.run_dir} | train tasks {len(self.train_tasks)} (held-out removed: "
              f"{self.totals['dropped_heldout']}) | eval tasks {len(self.eval_tasks)} | "
              f"devices {self.devices}")
        if not state:
            self.logger.text("hyperparameters", format_config(cfg), 0)
        self.last_save_t = time.monotonic()
        saved = {**cfg.saved(), DTYPE_CHOICE: first_choice(self.run_dir, cfg.dtype) or self.parts.precision}
        self.folder.write_config(saved)  # setup succeeded
        self.clock.lap("setup")  # reference, teacher, optimizer, resume, run folder and logs

    def check_prompt_lengths(self) -> None:
        """Refuse (TaskFileError, exit 2) tasks whose first prompt is longer than the limit, naming each, or
        with --drop-long-prompts leave them out, counted."""
        sampling = sampling_params(self.cfg)
        limit = prompt_limit(self.policy, max_prompt_tokens=self.cfg.max_prompt_tokens, sampling=sampling,
                             max_turns=self.cfg.max_turns)
        if limit is None:
            return
        found = {what: long_prompts(tasks, policy=self.policy, env=self.env, limit=limit) if limit > 0 else tasks
                 for what, tasks in (("training", self.train_tasks), ("held-out", self.eval_tasks))}
        if self.cfg.max_prompt_tokens is None and len(found["training"]) == len(self.train_tasks):
            # the turns' room leaves no task a place: --drop-long-prompts would drop them all
            raise ConfigError([no_room(self.policy, sampling=sampling, max_turns=self.cfg.max_turns, limit=limit)],
                              "--max-turns / --max-new-tokens")
        if not any(found.values()):
            return
        if not self.cfg.drop_long_prompts:
            problems = [line for what, f in found.items() for line in describe_long(f, limit, what)]
            source = " and ".join(s for s, what in ((self.cfg.tasks, "training"), (self.cfg.eval_tasks, "held-out"))
                                  if found[what])
            raise TaskFileError(source, problems + ["pass --drop-long-prompts to leave them out"])
        for what, attr in (("training", "train_tasks"), ("held-out", "eval_tasks")):
            if found[what]:
                long_ids = {id(t) for t, _, _ in found[what]}
                setattr(self, attr, [t for t in getattr(self, attr) if id(t) not in long_ids])
                t, n, _ = found[what][0]
                self.say(f"[tasks] left out {len(found[what])} {what} task(s) whose prompt is longer than {limit} "
                         f"tokens (--drop-long-prompts; first: {t['task_id']}, {n} tokens)")
        if not self.train_tasks:
            raise TaskFileError("--tasks", [f"every training task's prompt is longer than {limit} tokens"])

    def check_resumable(self, state: dict) -> None:
        """Refuse (ConfigError, exit 2) a resume that would change the model or, unless accepted, the task order."""
        problems = fingerprint.fixed_changes(state["config"], asdict(self.cfg))
        changed = fingerprint.order_changes(state.get("task_order"), self.task_order)
        if changed and not self.cfg.resume_new_data:
            problems += [f"task order differs from the checkpoint's: {c}" for c in changed]
            problems.append("pass --resume-new-data to train on the new order, from a new epoch")
        if problems:
            raise ConfigError(problems, f"--resume {self.run_dir}")

    def _updating(self, *_) -> None:
        self.committing = self.dirty = True

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

    # ---- evaluation ------------------------------------------------------------------------
    def evaluate_before(self) -> None:
        """Held-out eval at step 0 (not again on resume), recorded in eval.json."""
        if self.start_step == 0:
            self.write_eval_summary(self.evaluate(0), None)

    def evaluate(self, step: int) -> dict | None:
        """The held-out set's results (greedy, and pass@k with --eval-samples), with each --eval-set's under
        "sets"; None when there is nothing to evaluate."""
        if not self.eval_tasks and not self.eval_sets:
            return None
        res = self.evaluate_set("", self.eval_tasks, step) if self.eval_tasks else {}
        if self.eval_sets:
            res["sets"] = {name: self.evaluate_set(name, tasks, step) for name, tasks in self.eval_sets.items()}
        return res

    def evaluate_set(self, name: str, tasks: list[dict], step: int) -> dict:
        """One set, logged as eval/... (the held-out set, name '') or eval/<name>/..."""
        t0 = time.perf_counter()
        hang_s = self.cfg.worker_timeout_s or self.EVAL_HANG_S
        res = evaluate(self.policy, tasks, sampling=sampling_params(self.cfg), env=self.env,
                       max_batch_episodes=self.cfg.max_batch_episodes, hang_timeout_s=hang_s)
        if self.cfg.eval_samples:
            res.update(evaluate_sampled(self.policy, tasks, env=self.env, samples=self.cfg.eval_samples,
                                        sampling=replace(sampling_params(self.cfg), temperature=self.cfg.eval_temperature),
                                        ks=self.cfg.eval_k, seed=self.cfg.seed,
                                        max_batch_episodes=self.cfg.max_batch_episodes, hang_timeout_s=hang_s))
        prefix = f"eval/{name}/" if name else "eval/"
        self.logger.scalars({f"{prefix}{k}": v for k, v in res.items() if k != "n"}, step)
        label = f" {name}" if name else ""
        if res["grader_timeouts"]:
            self.say(f"[grader] held-out eval{label} at step {step}: {res['grader_timeouts']} answer check(s) ran out "
                     f"of --grader-timeout-s {self.cfg.grader_timeout_s:g} (scored 0); first: task "
                     f"{res['first_timeout_task']}")
        sampled = "".join(f" | {k} {v:.3f}" for k, v in res.items() if k.startswith(("pass@", "mean@")))
        failed = "".join(f" | {k.replace('_', ' ')} {res[k]} (not scored: left out)"
                         for k in ("failed", "sampled_failed") if res.get(k))
        self.say(f"[eval{label}] step {step} | success {res['success_rate']:.3f} | first turn "
                 f"{res['first_turn_success']:.3f} | turns {res['mean_turns']:.2f}{sampled} | n {res['n']}{failed} | "
                 f"{time.perf_counter() - t0:.1f} s")
        return res

    def write_eval_summary(self, before: dict | None, after: dict | None) -> None:
        path = self.run_dir / "eval.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        if before is not None and "before" not in summary:
            summary["before"] = json_ready(before)
        if after is not None:
            summary["after"] = json_ready(after)
        summary.update(success_gain(summary))
        write_atomic(path, json.dumps(summary, indent=2) + "\n")

    # ---- the loop --------------------------------------------------------------------------
    def train(self, source: RolloutSource, on_step: Callable[["TrainingRun", int], None] | None = None) -> dict:
        """Steps start_step .. max_steps - 1 on `source`'s episodes, until done or stopped; `on_step(run, n)`
        after step n is on record (logged, checkpointed when due)."""
        cfg = self.cfg
        self.source = source
        self.attach_ranks()
        bar = tqdm(range(self.start_step, cfg.max_steps), desc="train", dynamic_ncols=True, leave=False,
                   disable=self.quiet)
        for step in bar:
            if self.stop_requested:
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
            if self.stop_requested:
                break
            self.check_trained(at_end=False)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.max_steps:
                self.evaluate(step + 1)
        bar.close()
        self.end_loop()
        return {"step": self.final_step}

    def rollout(self, step: int) -> tuple[list[RolloutResult] | None, dict]:
        """Step `step`'s episodes from the source, every learner rank starting the step with it, and their
        scalars; the grader, tool and collapse alarms look at them. (None, {}) when the run stops instead."""
        self.ranks.begin(step)  # the other ranks start it too (and other nodes' leaders their rollouts)
        results, extra = self.source.next_batch(step)
        if self.stop_requested or results is None:
            return None, {}
        metrics = rollout_metrics(results, env=self.env)
        metrics.update(extra)
        self.report_grader_timeouts(results, step + 1)
        self.report_no_tool_calls(results, metrics, step + 1)
        self.report_collapse(results, step + 1)
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
        """From here the step is being committed: the task sampler learns its outcomes, then the source does its
        work after an update (publishing the weights; the pipeline draws later steps, from the new estimates)."""
        self.committing = True  # already set by the optimizer's hook, unless the update was skipped
        return {**self.observe(results), **self.source.after_update(step)}

    def observe(self, results: list[RolloutResult]) -> dict:
        """The signal sampler's estimates take the step's groups (failed episodes left out); its sampler/* scalars.
        Only a committed step's: a step abandoned before its update is drawn again on resume, from these."""
        if not isinstance(self.stream, SignalSampler):
            return {}
        groups: dict[str, list[RolloutResult]] = {}
        for r in results:
            groups.setdefault(r.group_id, []).append(r)
        return self.stream.observe([(rs[0].task_id, [r.succeeded for r in rs if not r.failed])
                                    for rs in groups.values()])

    def record(self, step: int, results: list[RolloutResult], metrics: dict, t0: float, bar) -> None:
        """Step `step` on record: the run's totals, the derived scalars, the logs, the console line and a
        checkpoint when one is due."""
        self.final_step = step
        self.dirty = False
        self.totals["skipped_nan"] += metrics["train/skipped_nan"]
        self.totals["env_error_steps"] = self.totals.get("env_error_steps", 0) + (  # every group dropped
            bool(results) and metrics["rollout/groups_dropped"] == len(group_by_task_id(results)))
        metrics["train/env_error_steps_total"] = self.totals["env_error_steps"]
        metrics.update(derived_metrics(metrics, results, step_s=time.perf_counter() - t0,
                                       skipped_nan_total=self.totals["skipped_nan"]))
        self.logger.scalars(metrics, step)
        self.history.append(metrics)
        del self.history[:-self.HISTORY]  # bounded: a week-long run must not grow
        sample_every = self.cfg.sample_every
        self.logger.episodes(results, step, log_text=sample_every > 0 and step % sample_every == 0)
        if not self.quiet:
            bar.write(self.console_line(step, metrics))
        self.save_when_due(step)
        self.committing = False  # the step is on record; an eval may be interrupted

    def save_when_due(self, step: int) -> None:
        """A checkpoint every --save-every steps, or when --save-every-minutes passed since the last one."""
        cfg = self.cfg
        minutes = (time.monotonic() - self.last_save_t) / 60
        if ((cfg.save_every and step % cfg.save_every == 0)
                or (cfg.save_every_minutes and minutes >= cfg.save_every_minutes)):
            with self.ranks.guarded():  # FSDP: the ranks gather the optimizer state
                self.save_periodic(step)

    def end_loop(self) -> None:
        """After the last step: a run that reached max_steps is checked for having trained; the learner ranks go
        (FSDP saves the last checkpoint first, while they can gather its optimizer state)."""
        if not self.stop_requested and self.final_step == self.cfg.max_steps:
            self.warn_no_tool_calls(self.final_step - self.start_step)  # a run shorter than --tool-alarm-steps
            self.check_trained(at_end=True)
        if self.ranks.parallel == "fsdp":
            self.save_last()
        self.ranks.release()

    def check_trained(self, *, at_end: bool) -> None:
        """Raise TrainedNothing once more than --max-skipped-frac of --max-steps updates trained nothing (the
        share is out of reach: stop now), or at the end if every update did."""
        nan, env = self.totals["skipped_nan"], self.totals.get("env_error_steps", 0)
        skipped, limit = nan + env, self.cfg.max_skipped_frac
        if skipped > limit * self.cfg.max_steps or (at_end and skipped >= self.final_step > 0):
            raise TrainedNothing(
                f"{skipped} of {self.final_step} updates trained nothing ({nan} skipped for a non-finite loss or "
                f"gradient, {env} with every group dropped for env errors or failed reward scores: see the [env] and "
                f"[reward] lines above), more than "
                f"--max-skipped-frac {limit:g} of --max-steps {self.cfg.max_steps}; the run is not done")

    def report_grader_timeouts(self, results: list[RolloutResult], step: int) -> None:
        """The first step with answer checks out of CPU time says so, with a task (then only the scalar)."""
        n, first = grader_timeouts(results)
        self.totals["grader_timeouts"] = self.totals.get("grader_timeouts", 0) + n
        if n and self.totals["grader_timeouts"] == n:
            self.say(f"[grader] step {step}: {n} answer check(s) ran out of --grader-timeout-s "
                     f"{self.cfg.grader_timeout_s:g} (scored 0, counted as reward/grader_timeouts); "
                     f"first: task {first}")

    def report_no_tool_calls(self, results: list[RolloutResult], metrics: dict, step: int) -> None:
        """With --tools: when the first --tool-alarm-steps steps parsed no tool call at all, one warning names the
        parser, what rendered the tools and a raw response (the model's format and the parser's may differ); a run
        shorter than that warns at its end (`warn_no_tool_calls`)."""
        n = self.cfg.tool_alarm_steps
        if "rollout/tool_calls_per_episode" not in metrics or not n or step - self.start_step > n:
            return
        self.tool_calls_seen += metrics["rollout/tool_calls_per_episode"]
        responses = [s.model_response for r in results for s in r.trajectory.steps]
        self.call_like_seen = self.call_like_seen or any(map(call_like, responses))
        if self.tool_reply is None:
            self.tool_reply = next((text for text in responses if text), "")
        if step - self.start_step == n:
            self.warn_no_tool_calls(n)

    def warn_no_tool_calls(self, steps: int) -> None:
        """The zero-call warning for the first `steps` steps, once, unless a call was parsed (or no --tools step ran)."""
        if self.tool_reply is None or self.tool_calls_seen or self.tool_alarm_said:
            return
        self.tool_alarm_said = True
        parser, rendered_by = tool_format(self.policy.tokenizer, self.cfg.tool_parser)
        hint = ("If the model writes calls in another format, set --tool-parser (docs/tools.md)" if self.call_like_seen
                else "No response holds a call in any format the parsers read: the model does not call tools yet; "
                "teach it the call first with a supervised warm start (docs/warm-start.md), or set --tool-parser if "
                "it writes calls in a format of its own (docs/tools.md)")
        self.say(f"[tools] warning: the first {steps} steps parsed no tool call (parser {parser}, tools rendered by "
                 f"the {rendered_by}); a response: {self.tool_reply[:300]!r}. {hint}")

    def report_collapse(self, results: list[RolloutResult], step: int) -> None:
        """One warning, once, when the step ends --collapse-alarm-steps steps whose every group held one distinct
        final answer with a reward mean below 1 (trainer/collapse.py)."""
        if warning := self.collapse.feed(results, step):
            self.say(warning)

    def attach_ranks(self) -> None:
        """Every learner rank gets this rank's weights and optimizer state (after the workers' shared
        block is in place: the DDP replica is made of the parameters the workers read)."""
        where = self.ranks.attach(self.policy, self.optimizer)
        if where:
            self.say(where_line(where))

    def console_line(self, step: int, m: dict) -> str:
        line = (f"step {step}/{self.cfg.max_steps} | reward {m.get('reward/mean', 0):.2f} | success "
                f"{m.get('success_rate', 0):.2f} | first {m.get('success_rate/first_turn', 0):.2f} | "
                f"loss {m.get('loss/policy', 0):+.4f} | ")
        if "pipeline/policy_lag_mean" in m:
            line += f"lag {m['pipeline/policy_lag_mean']:.1f} | "
        return line + f"{m['perf/step_s']:.1f} s"

    def save_checkpoint(self, step: int) -> Path:
        optimizer_state = self.ranks.optimizer_state(self.policy, self.optimizer)  # first: it may be refused
        position = self.source.position_at(step) if self.source else self.stream.position
        path = checkpoint.save(self.run_dir, step, config=self.cfg.saved(), keep=self.cfg.keep_checkpoints,
                               policy=self.policy, optimizer_state=optimizer_state, stream_position=position,
                               stream_origin=self.stream.origin, task_order=self.task_order, totals=self.totals,
                               sampler=self.stream.state())
        self.last_save_t = time.monotonic()
        self.say(f"[checkpoint] {path}")
        return path

    def save_periodic(self, step: int) -> Path | None:
        """A periodic checkpoint; one the disk refuses (full, quota) is reported and tried again at the
        next save point while the run goes on: its weights are still in memory."""
        try:
            return self.save_checkpoint(step)
        except OSError as e:
            self.last_save_t = time.monotonic()
            saved = checkpoint.list_complete(self.run_dir)
            print(f"[checkpoint] step {step} not written ({type(e).__name__}: {e}); the run goes on and tries again "
                  f"at the next save point; the last one on disk is {saved[-1].name if saved else 'none'}", flush=True)
            return None

    def save_last(self) -> Path | None:
        """Checkpoint the last completed step, unless it is on disk already. Refused only when an
        error struck inside an optimizer step: those weights belong to no step."""
        if self.dirty:
            print("[checkpoint] not written: the run failed inside an optimizer step, so the weights match "
                  "no step; the previous checkpoint stands", flush=True)
            return None
        saved = {p.name: p for p in checkpoint.list_complete(self.run_dir)}
        try:
            return saved.get(f"{checkpoint.PREFIX}{self.final_step}") or self.save_checkpoint(self.final_step)
        except ShardsUnavailable as e:  # never a checkpoint with a partial optimizer state
            stands = list(saved)[-1] if saved else "none: a resume starts from scratch"
            print(f"[checkpoint] step {self.final_step} not written: {e}; the previous checkpoint stands "
                  f"({stands})", flush=True)
            return None

    def finish(self) -> dict:
        """After a run that completed: final eval and final model. Returns eval.json's content."""
        after = self.evaluate(self.final_step)
        self.write_eval_summary(None, after)
        if self.cfg.save_model:
            self.save_final_model()
        self.logger.flush()
        path = self.run_dir / "eval.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def save_final_model(self) -> None:
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

    def cleanup(self) -> None:
        if self.folder is not None:
            self.folder.close()  # the sinks, then the lock: the run's final writes happen under it


def first_choice(run_dir: Path, dtype: str) -> str | None:
    """The dtype choice config.json already records for `dtype` (a resumed run keeps why its start chose it)."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return saved.get(DTYPE_CHOICE) if isinstance(saved, dict) and saved.get("dtype") == dtype else None
