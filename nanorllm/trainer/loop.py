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

import json
import random
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from nanorllm.chaos.faults import fault
from nanorllm.config import DEFAULT_EVAL_TASKS, DEFAULT_TASKS, ConfigError, TrainConfig, format_config
from nanorllm.core.types import RolloutResult
from nanorllm.datasets.stream import TaskStream
from nanorllm.datasets.tasks import check_task_rows, remove_overlap
from nanorllm.envs.base import EnvBundle
from nanorllm.envs.registry import describe, env_from_config
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import LoraSpec, save_merged, trainable_line, trainable_parameters
from nanorllm.ranks.group import ONE_RANK, LearnerRanks, ShardsUnavailable, learner_spec
from nanorllm.ranks.start import start_ranks
from nanorllm.rollout.build import sampling_params
from nanorllm.trainer import checkpoint, fingerprint
from nanorllm.trainer.evaluate import evaluate
from nanorllm.trainer.metrics import grader_timeouts, rollout_metrics
from nanorllm.trainer.parity import startup_parity_line
from nanorllm.trainer.reference import reference_policy
from nanorllm.trainer.runlock import LOCK_NAME, RunLock
from nanorllm.trainer.source import RolloutSource
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.devices import DeviceMap, configure_threads, resolve_devices
from nanorllm.utils.files import write_atomic
from nanorllm.utils.logger import RunLogger


def default_run_name(cfg: TrainConfig) -> str:
    tasks = Path(cfg.tasks).stem if not cfg.tasks.startswith("arith") else "arith"
    return f"{tasks}__{cfg.exp_name}__{cfg.seed}__{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def load_task_sets(cfg: TrainConfig, env: EnvBundle) -> tuple[list[dict], list[dict], int, dict]:
    """(train, held-out, number of training tasks dropped because they are held out, task-order fingerprint),
    loaded by the env; the task fields left at their defaults give the env's own default tasks."""
    spec = env.default_tasks if cfg.tasks == DEFAULT_TASKS and env.default_tasks else cfg.tasks
    eval_spec = env.default_eval_tasks if cfg.eval_tasks == DEFAULT_EVAL_TASKS and env.default_eval_tasks \
        else cfg.eval_tasks
    loaded = check_task_rows(env.load_tasks(spec, limit=cfg.limit), spec)
    heldout = check_task_rows(env.load_tasks(eval_spec, limit=cfg.eval_limit), eval_spec) if eval_spec else []
    train, dropped = remove_overlap(loaded, heldout)
    if not train:
        raise ValueError(f"no training tasks left after removing the {dropped} that are held out")
    kept = {id(t) for t in train}
    order = fingerprint.task_order(loaded, [t for t in loaded if id(t) not in kept], cfg.seed)
    return train, heldout, dropped, order


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
                 quiet: bool = False):
        self.cfg = cfg
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
        self.totals = {"skipped_nan": 0, "dropped_heldout": 0}
        self.ranks: LearnerRanks = ONE_RANK  # this process is learner rank 0 of ranks.world
        # Made by setup(), in this order:
        self.devices: DeviceMap | None = None
        self.train_tasks: list[dict] = []
        self.eval_tasks: list[dict] = []
        self.task_order: dict | None = None  # the fingerprint checkpoints carry (trainer/fingerprint.py)
        self.run_dir: Path | None = None
        self.lock: RunLock | None = None  # held from before the folder is touched until cleanup's end
        self.policy: HFCausalPolicy | None = None
        self.ref_policy = None  # only with kl_coef > 0: a frozen copy, or under LoRA the adapters off (reference.py)
        self.optimizer: torch.optim.Optimizer | None = None
        self.stream: TaskStream | None = None
        self.logger: RunLogger | None = None  # None: nothing written yet, nothing to save or close
        self.last_save_t = time.monotonic()

    # ---- setup -----------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.devices = resolve_devices(cfg.devices, cfg.num_workers, serial=cfg.serial, learner_spec=learner_spec(cfg))
        self.ranks = start_ranks(self.devices, cfg.learner_timeout_s, cfg.worker_start_timeout_s,
                                 parallel=cfg.learner_parallel)  # the other ranks load meanwhile
        self.use_cores(alone=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.env = env_from_config(cfg)
        self.train_tasks, self.eval_tasks, self.totals["dropped_heldout"], self.task_order = \
            load_task_sets(cfg, self.env)
        state = None
        self.run_dir = Path(self.resume_dir or Path(cfg.output_dir) / (cfg.run_name or default_run_name(cfg)))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.run_dir).acquire()  # before anything in the folder is read, cleaned or written
        if self.resume_dir:
            for p in checkpoint.clean_stale(self.run_dir):
                self.say(f"[resume] removed {p.name}, left by a process that died while writing it")
            ckpt_dir, state = checkpoint.load_latest(self.run_dir)
            self.check_resumable(state)
            model_source = str(ckpt_dir / "model")
        else:
            if any(p.name != LOCK_NAME for p in self.run_dir.iterdir()):
                raise FileExistsError(f"{self.run_dir} exists and is not empty; use --resume {self.run_dir} "
                                      "to continue it or choose another --run-name")
            model_source = cfg.model
        lora = LoraSpec.from_config(cfg)
        if lora is None:
            self.policy = HFCausalPolicy.from_name(model_source, device=self.devices.learner, dtype=cfg.dtype,
                                                   seed=cfg.seed)
        else:  # the base from --model, the adapters from the checkpoint on resume
            self.policy = HFCausalPolicy.from_name(cfg.model, device=self.devices.learner, dtype=cfg.dtype,
                                                   seed=cfg.seed, lora=lora, adapter=model_source if state else None)
        self.policy.graphs_enabled = cfg.cuda_graphs
        self.say(trainable_line(self.policy))
        self.say(startup_parity_line(self.policy, temperature=cfg.temperature))  # stops a run that would train on noise
        self.ref_policy = reference_policy(self.policy, cfg, self.devices.learner,
                                           cfg.model if not state else state["reference_model"])
        self.optimizer = make_optimizer(self.policy, cfg)
        self.optimizer.register_step_pre_hook(self._updating)
        self.stream = TaskStream(self.train_tasks, seed=cfg.seed)
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
        self.ranks.broadcast({"cfg": cfg, "processes": self.processes(), "start_step": self.start_step,
                              "reference_model": cfg.model if not state else state["reference_model"]})
        self.logger = RunLogger(self.run_dir, dump_size=cfg.rollout_dump_size,
                                purge_step=self.start_step + 1 if state else None)
        self.say(format_config(cfg).replace("|-|-|\n", ""))
        self.say(describe(self.env))
        if self.overrides:
            self.say(f"[resume] overriding the saved config with: {self.overrides}")
        self.say(f"[run] {self.run_dir} | train tasks {len(self.train_tasks)} (held-out removed: "
              f"{self.totals['dropped_heldout']}) | eval tasks {len(self.eval_tasks)} | "
              f"devices {self.devices}")
        if not state:
            self.logger.text("hyperparameters", format_config(cfg), 0)
        self.last_save_t = time.monotonic()
        write_atomic(self.run_dir / "config.json", json.dumps(cfg.saved(), indent=2) + "\n")  # setup succeeded

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
        """All CPU cores while this process runs alone (setup, evaluation before and after
        training), its share while worker processes run beside it."""
        alone = alone or self.cfg.serial
        configure_threads(self.devices.learner, self.cfg.threads if not alone else None,
                          1 if alone else self.processes())

    def processes(self) -> int:
        """Processes of this run on this machine: its workers and its learner ranks."""
        return len(self.devices.workers) + self.ranks.local_world

    # ---- evaluation ------------------------------------------------------------------------
    def evaluate_before(self) -> None:
        """Held-out eval at step 0 (not again on resume), recorded in eval.json."""
        if self.start_step == 0:
            self.write_eval_summary(self.evaluate(0), None)

    def evaluate(self, step: int) -> dict | None:
        if not self.eval_tasks:
            return None
        t0 = time.perf_counter()
        res = evaluate(self.policy, self.eval_tasks, sampling=sampling_params(self.cfg), env=self.env,
                       max_batch_episodes=self.cfg.max_batch_episodes,
                       hang_timeout_s=self.cfg.worker_timeout_s or self.EVAL_HANG_S)
        self.logger.scalars({f"eval/{k}": v for k, v in res.items() if k != "n"}, step)
        if res["grader_timeouts"]:
            self.say(f"[grader] held-out eval at step {step}: {res['grader_timeouts']} answer check(s) ran out of "
                     f"--grader-timeout-s {self.cfg.grader_timeout_s:g} (scored 0); first: task "
                     f"{res['first_timeout_task']}")
        self.say(f"[eval] step {step} | success {res['success_rate']:.3f} | first turn "
                 f"{res['first_turn_success']:.3f} | turns {res['mean_turns']:.2f} | n {res['n']} | "
                 f"{time.perf_counter() - t0:.1f} s")
        return res

    def write_eval_summary(self, before: dict | None, after: dict | None) -> None:
        path = self.run_dir / "eval.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        if before is not None and "before" not in summary:
            summary["before"] = before
        if after is not None:
            summary["after"] = after
        if "before" in summary and "after" in summary:
            summary["gain"] = summary["after"]["success_rate"] - summary["before"]["success_rate"]
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
                self.ranks.begin(step)  # the other ranks start it too (and other nodes' leaders their rollouts)
                results, extra = source.next_batch(step)
                if self.stop_requested or results is None:
                    break
                if fault("learner_step") == str(step + 1):
                    raise RuntimeError(f"injected fault: learner_step {step + 1}")
                metrics = rollout_metrics(results, env=self.env)
                metrics.update(extra)
                self.report_grader_timeouts(results, step + 1)
                share = self.ranks.share(results, self.policy.version)  # all of it with one rank
                metrics.update(train_step(self.policy, self.optimizer, share, cfg, ref_policy=self.ref_policy,
                                          ranks=self.ranks))
                if fault("nan_weights") == str(step + 1):
                    with torch.no_grad():
                        trainable_parameters(self.policy.model)[0][1].view(-1)[0] = float("nan")
                check_finite_weights(self.policy.model, step + 1)  # else the run stops dirty: no checkpoint of them
            self.committing = True  # already set by the optimizer's hook, unless the update was skipped
            metrics.update(source.after_update(step))
            self.final_step = step + 1
            self.dirty = False
            self.totals["skipped_nan"] += metrics["train/skipped_nan"]
            metrics["train/skipped_nan_total"] = self.totals["skipped_nan"]
            metrics["perf/step_s"] = time.perf_counter() - t0
            metrics["perf/train_tokens_per_s"] = metrics["train/tokens"] / max(metrics["perf/train_s"], 1e-9)
            gen_tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
            metrics["perf/tokens_per_s"] = (gen_tokens + metrics["train/padded_tokens"]) / metrics["perf/step_s"]
            # approx_kl is measured before the update: sampler vs learner logprobs on the same tokens
            # (policy lag plus numerical differences between the decode and the training forward).
            metrics["pipeline/mismatch_kl"] = metrics["approx_kl"]
            metrics["train/episodes"] = len(results)
            metrics["perf/episodes_per_s"] = len(results) / metrics["perf/step_s"]
            self.logger.scalars(metrics, step + 1)
            self.history.append(metrics)
            del self.history[:-self.HISTORY]  # bounded: a week-long run must not grow
            self.logger.episodes(results, step + 1, log_text=cfg.sample_every > 0 and (step + 1) % cfg.sample_every == 0)
            if not self.quiet:
                bar.write(self.console_line(step + 1, metrics))
            minutes = (time.monotonic() - self.last_save_t) / 60
            if ((cfg.save_every and (step + 1) % cfg.save_every == 0)
                    or (cfg.save_every_minutes and minutes >= cfg.save_every_minutes)):
                with self.ranks.guarded():  # FSDP: the ranks gather the optimizer state
                    self.save_periodic(step + 1)
            self.committing = False  # the step is on record; an eval may be interrupted
            if on_step is not None:
                on_step(self, step + 1)
            if self.stop_requested:
                break
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.max_steps:
                self.evaluate(step + 1)
        bar.close()
        if self.ranks.parallel == "fsdp":  # the last checkpoint's optimizer state needs the ranks: before they go
            self.save_last()
        self.ranks.release()
        return {"step": self.final_step}

    def report_grader_timeouts(self, results: list[RolloutResult], step: int) -> None:
        """The first step with answer checks out of CPU time says so, with a task (then only the scalar)."""
        n, first = grader_timeouts(results)
        self.totals["grader_timeouts"] = self.totals.get("grader_timeouts", 0) + n
        if n and self.totals["grader_timeouts"] == n:
            self.say(f"[grader] step {step}: {n} answer check(s) ran out of --grader-timeout-s "
                     f"{self.cfg.grader_timeout_s:g} (scored 0, counted as reward/grader_timeouts); "
                     f"first: task {first}")

    def attach_ranks(self) -> None:
        """Every learner rank gets this rank's weights and optimizer state (after the workers' shared
        block is in place: the DDP replica is made of the parameters the workers read)."""
        where = self.ranks.attach(self.policy, self.optimizer)
        if where:
            self.say(f"[ranks] {len(where)} learner ranks: " + ", ".join(
                f"rank {r} on {host} {device} pid {pid}" for r, (host, pid, device) in enumerate(where)))

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
                               stream_origin=self.stream.origin, task_order=self.task_order, totals=self.totals)
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
            self.policy.save(str(self.run_dir / "final_model"))
            if self.policy.peft is not None and self.cfg.lora_merged:
                save_merged(self.policy.model, self.policy.tokenizer, self.run_dir / "final_model" / "merged")
        self.logger.flush()
        path = self.run_dir / "eval.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def cleanup(self) -> None:
        if self.logger is not None:
            self.logger.close()
        if self.lock is not None:
            self.lock.release()  # last: the run's final writes happen under it
