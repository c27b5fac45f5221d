"""PipelineSource: the learner's side of the actor/learner pipeline.

The training loop (trainer/loop.py) is the same as in serial mode; only where a step's episodes
come from changes. Here:

- the workers start (imports, model load) as soon as the source is built, but are handed no job
  before training asks for its first batch: the held-out evaluation at step 0 runs meanwhile.
- step s's groups are cut into one job per worker (a group never spans workers, so it arrives
  whole) and dispatched ahead of time: jobs for steps up to v + max_policy_lag are out while the
  learner holds version v. A job for step s carries min_version = s - max_policy_lag; a worker
  does not start it on older weights. lag 0 = synchronous, lag 1 = the next batch is generated
  while this one trains.
- after each update the learner publishes the weights (version + 1) and dispatches the next step.
- a batch whose version still lags more than the bound is dropped, counted and re-issued.
- a worker that dies, or hangs (its heartbeat stands still past the timeout: it is SIGKILLed), is
  reported with its device and what it was doing, restarted after a back-off that doubles with
  each failure in a row, and its unfinished jobs go to the other workers (or wait for one). A
  job's result is used once (a late duplicate is discarded), so no group is lost or trained twice.
  Past the restart caps the run stops with the worker's own last error (`PipelineError`).

Several machines (torchrun --nnodes K, learner ranks on each: ranks/group.py): every node's local
rank 0 runs its own workers with a PipelineSource of its own (`draws=False`). Rank 0 alone draws
tasks; it cuts each step's groups into one share per node, keeps its own and sends the others'
with one broadcast over the process group after each update (when local jobs are dispatched too),
and receives their episodes with one `gather_object` when the step starts. Every node's leader is a
DDP replica, so after each update it publishes its own (identical) weights into its node's shared
memory: no weights cross the network but DDP's gradient all-reduce. Node k's worker i signs its
episodes k x 1000 + i (`worker_id` in rollouts.jsonl). A node's worker faults are its
leader's to handle, as here; a node that dies breaks the process group (a dead rank: the run stops).
"""

import dataclasses
import time
from typing import Callable

import torch

from nanorllm.config import TrainConfig
from nanorllm.datasets.stream import TaskStream
from nanorllm.pipeline.messages import Fatal, Job, JobDone, JobFailed, NodeShare, Ready, WorkerMessage, WorkerStart
from nanorllm.pipeline.pool import WorkerPool
from nanorllm.pipeline.weights import SharedWeights
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.lora import trainable_parameters
from nanorllm.ranks.group import LearnerRanks
from nanorllm.trainer.metrics import decode_metrics
from nanorllm.trainer.source import FillRounds, rollout_seed
from nanorllm.utils.procs import exit_reason


class PipelineError(RuntimeError):
    """The pipeline cannot go on (workers keep failing); the message says why."""


def split_stale(results: list, learner_version: int, max_lag: int) -> tuple[list, list]:
    """(fresh, stale): stale = sampled by weights more than max_lag versions behind the learner."""
    fresh = [r for r in results if learner_version - r.policy_version <= max_lag]
    stale = [r for r in results if learner_version - r.policy_version > max_lag]
    return fresh, stale


class PipelineSource:
    MAX_JOB_ATTEMPTS = 3
    MAX_BACKOFF_S = 60.0

    PARTS_PER_NODE = 1000  # job numbers (and seeds) of node k start at k x this
    FILL_PARTS = 1_000_000  # fill_batch's round r: job numbers from r x this (seeds: fill_seed, as in serial)

    def __init__(self, start: WorkerStart, policy: HFCausalPolicy, optimizer: torch.optim.Optimizer, *,
                 stream: TaskStream | None, workers: list[str], ranks: LearnerRanks, start_step: int,
                 stop: Callable[[], bool], draws: bool = True):
        """Start the workers on `workers` (devices) with `start` (the run's config and its assembled specs) and
        `policy`'s weights as version `start_step`; jobs are drawn from `stream` (rank 0) or sent by rank 0
        (`draws=False`: another node's leader, no stream). `stop()` true: a wait for episodes gives up."""
        cfg: TrainConfig = start.cfg
        self.cfg, self.policy, self.stream, self.ranks, self.stop = cfg, policy, stream, ranks, stop
        self.draws = draws  # rank 0 draws every node's tasks; another node's leader runs its share of them
        self.outgoing: list[NodeShare] = []  # other nodes' shares of the steps drawn since the last broadcast
        self.lag = cfg.max_policy_lag
        # The one allocation of the shared buffer; on CPU the learner's parameters move into it.
        # It carries what trains: every parameter, or under LoRA the adapters alone (workers keep their base).
        self.weights = SharedWeights(policy.model, optimizer, version=start_step, readers=workers,
                                     params=trainable_parameters(policy.model))
        policy.version = start_step
        n = len(workers)
        self.pool = WorkerPool(start, self.weights, workers, threads=cfg.threads, num_processes=n + ranks.local_world)
        self.holding = True  # no job is handed out before training asks for its first batch
        self.outstanding: dict[str, Job] = {}  # job_id -> job, dispatched and not yet returned
        self.owner: dict[str, int | None] = {}  # job_id -> worker it was given to (None: waits for one)
        self.attempts: dict[str, int] = {}
        self.done: dict[str, JobDone] = {}  # job_id -> its episodes, returned and not yet trained on
        self.specs: dict[str, Job] = {}  # job_id -> job, kept until its step is trained
        self.step_jobs: dict[int, list[str]] = {}
        self.step_position: dict[int, int] = {}  # task-stream position before step s was drawn
        self.ready: set[int] = set()  # workers whose current process has loaded its model
        self.capture_s = 0.0  # the longest decode-graph capture a worker reported with its Ready
        self.failures = {wid: 0 for wid in range(n)}  # failures in a row, without a finished job
        self.last_error: dict[int, str] = {}  # a worker's own traceback, from its last Fatal message
        self.longest_job_s = 0.0
        self.totals = {"stale_dropped": 0, "worker_restarts": 0, "worker_hangs": 0, "job_errors": 0,
                       "duplicates": 0}
        self.next_step = start_step
        self._wait_s, self._cycle_t0, self._msgs, self._ready_groups = 0.0, time.perf_counter(), [], 0
        self._dispatch_upto(start_step + self.lag)
        self._exchange_jobs()

    # ---- dispatch ------------------------------------------------------------------------------
    def _dispatch_upto(self, last_step: int) -> None:
        while self.draws and self.next_step <= min(last_step, self.cfg.max_steps - 1):
            self._dispatch_step(self.next_step)
            self.next_step += 1

    def _dispatch_step(self, step: int) -> None:
        self.step_position[step] = self.stream.position
        picked = self.stream.take(self.cfg.tasks_per_step)
        size = -(-len(picked) // self.ranks.nodes)  # one node: all of it
        for node in range(1, self.ranks.nodes):
            self.outgoing.append(NodeShare(node, step, picked[node * size:(node + 1) * size]))
        self._add_step(step, picked[:size], node=0)

    def _add_step(self, step: int, picked: list, *, node: int) -> None:
        """This node's share of `step`: one job per worker (a group never spans workers)."""
        first = node * self.PARTS_PER_NODE
        self.step_jobs[step] = self._submit_parts(step, picked, first_part=first, min_version=max(0, step - self.lag),
                                                  seed=rollout_seed(self.cfg, step) + 7919 * first)

    def _submit_parts(self, step: int, picked: list, *, first_part: int, seed: int, min_version: int) -> list[str]:
        """`picked` as one job per worker: job `<step>.<first_part + i>` with seed + 7919 x i; their ids."""
        n_parts = min(len(self.pool.devices), len(picked))
        size = -(-len(picked) // max(n_parts, 1))
        ids = []
        for i in range(n_parts):
            chunk, part = picked[i * size:(i + 1) * size], first_part + i
            if not chunk:
                continue
            job = Job(job_id=f"{step}.{part}", step=step, tasks=[t for t, _ in chunk],
                      group_ids=[g for _, g in chunk], num_samples=self.cfg.num_samples_per_task,
                      seed=seed + 7919 * i, min_version=min_version)
            ids.append(job.job_id)
            self._submit(job)
        return ids

    def _exchange_jobs(self) -> None:
        """With several nodes: rank 0 sends every other node its new shares, each leader takes its own."""
        if self.ranks.nodes == 1:
            return
        shares = self.ranks.broadcast(self.outgoing if self.draws else None)
        self.outgoing = []
        for share in shares if not self.draws else []:
            if share.node == self.ranks.node:
                self._add_step(share.step, share.picked, node=self.ranks.node)

    def _submit(self, job: Job, exclude: int | None = None) -> None:
        """A new attempt at `job`: to the least loaded live worker, or waiting for one."""
        jid = job.job_id
        self.outstanding[jid] = job
        self.specs[jid] = job
        self.attempts[jid] = self.attempts.get(jid, 0) + 1
        self.owner[jid] = None
        self._assign(jid, exclude)

    def _assign(self, jid: str, exclude: int | None = None) -> None:
        if self.holding:
            return  # placed by the first next_batch (_assign_waiting)
        live = self.pool.up()
        if not live:
            return  # every worker is waiting out a back-off; _assign_waiting places it later
        live = [w for w in live if w in self.ready] or live  # not behind a worker still loading its model
        load = {wid: 0 for wid in live}
        for other, wid in self.owner.items():
            if other in self.outstanding and wid in load:
                load[wid] += 1
        candidates = [w for w in live if w != exclude] or live
        wid = min(candidates, key=lambda w: (load[w], w))
        self.owner[jid] = wid
        self.pool.submit(wid, self.outstanding[jid])

    def _assign_waiting(self) -> None:
        for jid in [j for j in self.outstanding if self.owner.get(j) is None]:
            self._assign(jid)

    # ---- receive -------------------------------------------------------------------------------
    def _handle(self, msg: WorkerMessage) -> None:
        wid = msg.worker_id
        if isinstance(msg, Ready):
            self.ready.add(wid)
            self.capture_s = max(self.capture_s, msg.capture_s)
            return
        if isinstance(msg, Fatal):
            self.last_error[wid] = msg.error
            return
        jid = msg.job_id
        if jid not in self.outstanding:  # already returned by an earlier attempt
            self.totals["duplicates"] += 1
            return
        if isinstance(msg, JobFailed):
            self.totals["job_errors"] += 1
            print(f"[pipeline] worker {wid} failed job {jid}:\n{msg.error}", flush=True)
            job = self.outstanding.pop(jid)
            if self.attempts[jid] >= self.MAX_JOB_ATTEMPTS:
                raise PipelineError(f"job {jid} failed {self.attempts[jid]} times; the last error:\n"
                                    f"{msg.error}")
            self._submit(job, exclude=wid)
            return
        self.outstanding.pop(jid)
        self.done[jid] = msg
        self._msgs.append(msg)
        self.failures[wid] = 0
        self.last_error.pop(wid, None)
        self.longest_job_s = max(self.longest_job_s, msg.times.rollout_s)

    def worker_timeout_s(self) -> float:
        return self.cfg.worker_timeout_s or max(60.0, 5 * self.longest_job_s)

    def _check_workers(self) -> None:
        """Deal with every worker that died or hung since the last look."""
        for wid, code in self.pool.dead():
            self._lose(wid, f"died ({exit_reason(code)})")
        hb = self.pool.heartbeat
        for wid in self.pool.up():
            limit = self.worker_timeout_s() if wid in self.ready else self.cfg.worker_start_timeout_s
            silent = hb.silence(wid)
            if silent > limit:
                self.totals["worker_hangs"] += 1
                self._lose(wid, f"hung (no progress for {silent:.1f} s, limit {limit:.0f} s; SIGKILLed)")

    def _lose(self, wid: int, reason: str) -> None:
        """Remove a dead or hung worker, keep what it finished, restart it later, re-issue the rest."""
        doing = self.pool.heartbeat.describe(wid, {jid: [t["task_id"] for t in job.tasks]
                                                    for jid, job in self.specs.items()})
        for msg in self.pool.remove(wid):  # whole messages it sent before it went
            self._handle(msg)
        self.ready.discard(wid)
        lost = [jid for jid, w in self.owner.items() if w == wid and jid in self.outstanding]
        self.failures[wid] += 1
        self.totals["worker_restarts"] += 1
        where = f"worker {wid} on {self.pool.devices[wid]}"
        if (self.failures[wid] > self.cfg.max_restarts_per_worker
                or self.totals["worker_restarts"] > self.cfg.max_restarts_per_run):
            raise PipelineError(
                f"{where} {reason} while {doing}; that is {self.failures[wid]} failures in a row and "
                f"{self.totals['worker_restarts']} in this run (caps --max-restarts-per-worker "
                f"{self.cfg.max_restarts_per_worker}, --max-restarts-per-run {self.cfg.max_restarts_per_run}). "
                + (f"Its last error:\n{self.last_error[wid]}" if wid in self.last_error else "It sent no error."))
        delay = min(self.cfg.restart_backoff_s * 2 ** (self.failures[wid] - 1), self.MAX_BACKOFF_S)
        print(f"[pipeline] {where} {reason} while {doing}; restarting it in {delay:.1f} s and re-issuing "
              f"{len(lost)} job(s): {lost}", flush=True)
        self.pool.restart_later(wid, delay)
        for jid in lost:
            self.owner[jid] = None
        self._assign_waiting()

    def _pump(self, timeout: float) -> None:
        """One round of the learner's watch: read messages, handle deaths and hangs, restarts."""
        for msg in self.pool.poll(timeout):
            self._handle(msg)
        self.weights.refresh_host()
        self._check_workers()
        if self.pool.start_due():
            self._assign_waiting()

    def _collect(self, job_ids: list[str]) -> bool:
        while not all(j in self.done for j in job_ids):
            if self.stop():
                return False
            self._pump(timeout=0.2)
        return True

    # ---- the RolloutSource interface -------------------------------------------------------------
    def wait_ready(self, stop: Callable[[], bool]) -> None:
        """Until every worker that is up has loaded its model (one in a back-off is not waited for)."""
        while not stop() and not set(self.pool.up()) <= self.ready:
            self._pump(timeout=0.05)

    def next_batch(self, step: int):
        t0 = time.perf_counter()
        self._cycle_t0 = t0
        version = self.policy.version
        if self.holding:  # training has begun: the jobs drawn so far go out
            self.holding = False
            self._assign_waiting()
        self._pump(timeout=0.0)
        self._ready_groups = sum(len(self.specs[jid].group_ids) for jid in self.done)
        results = self._take(list(self.step_jobs[step]), version)
        if results is None:
            return None, {}
        if self.ranks.nodes > 1:  # every node's episodes of this step reach rank 0
            for r in results if not self.draws else []:
                r.worker_id += self.ranks.node * self.PARTS_PER_NODE  # node k's worker i is k x 1000 + i
            parts = self.ranks.gather(results)
            results = [r for part in parts for r in part] if self.draws else results
        filled = {}
        if self.cfg.fill_batch and self.draws:
            results, filled = self._fill(step, results, version)
            if results is None:
                return None, {}
        for jid in self.step_jobs.pop(step):  # a late duplicate of these is now recognised as one
            self.owner.pop(jid, None)
            self.specs.pop(jid, None)
            self.attempts.pop(jid, None)
        self.step_position.pop(step - 1, None)
        self._wait_s = time.perf_counter() - t0
        return results, {**self._batch_metrics(results, version), **filled}

    def _take(self, pending: list[str], version: int) -> list | None:
        """The episodes of jobs `pending`, stale ones re-issued on current weights until fresh; None: stopped."""
        results = []
        while pending:
            if not self._collect(pending):
                return None
            stale_jobs = []
            for jid in pending:  # one job = one weights version, so it is all fresh or all stale
                fresh, stale = split_stale(self.done.pop(jid).results, version, self.lag)
                results.extend(fresh)
                if stale:
                    self.totals["stale_dropped"] += len(stale)
                    stale_jobs.append(jid)
            for jid in stale_jobs:  # the same groups again, on current weights
                self._submit(dataclasses.replace(self.specs[jid], min_version=version))
            pending = stale_jobs
        return results

    def _fill(self, step: int, results: list, version: int) -> tuple[list | None, dict]:
        """fill_batch (max_policy_lag 0: no later step has drawn yet, so the extra tasks follow the step's own in
        the stream and its checkpoint position covers them): FillRounds, each round one job per worker. A worker
        lost meanwhile has its extra jobs re-issued like any other. On this node's workers only."""
        fill = FillRounds(self.cfg, self.stream, step, results)
        for round_, picked, seed in fill.rounds():
            ids = self._submit_parts(step, picked, first_part=self.FILL_PARTS * round_, min_version=version, seed=seed)
            self.step_jobs[step] += ids  # cleaned up with the step's own
            got = self._take(ids, version)
            if got is None:
                return None, {}
            results = results + got
            fill.add(got)
        return results, fill.metrics()

    def _batch_metrics(self, results: list, version: int) -> dict:
        lags = [version - r.policy_version for r in results]
        msgs, self._msgs = self._msgs, []  # the results that arrived since the last batch
        m = {
            "pipeline/policy_lag_mean": sum(lags) / max(len(lags), 1),
            "pipeline/policy_lag_max": max(lags, default=0),
            "pipeline/stale_dropped": self.totals["stale_dropped"],
            # > 0: finished groups were already waiting when the learner asked (learner-bound)
            "pipeline/ready_batches": self._ready_groups / self.cfg.tasks_per_step,
            "pipeline/worker_restarts": self.totals["worker_restarts"],
            "pipeline/worker_hangs": self.totals["worker_hangs"],
            "pipeline/job_errors": self.totals["job_errors"],
        }
        times = [x.times for x in msgs]
        wall = sum(t.wall_s for t in times)
        if wall > 0:
            m["pipeline/worker_wait_frac"] = sum(t.weight_wait_s + t.queue_wait_s for t in times) / wall
            m["pipeline/worker_idle_frac"] = sum(t.idle_s for t in times) / wall
        loads = sum(t.loads for t in times)
        if loads:
            m["pipeline/weight_load_s"] = sum(t.load_s for t in times) / loads
        total_rate = 0.0
        for x in msgs:
            rate = x.timings.get("gen_tokens", 0) / max(x.times.rollout_s, 1e-9)
            m[f"pipeline/worker{x.worker_id}/gen_tokens_per_s"] = rate
            total_rate += rate
        m["perf/gen_tokens_per_s"] = total_rate
        m.update(decode_metrics([x.timings for x in msgs]))
        m["perf/rollout_s"] = max((t.rollout_s for t in times), default=0.0)
        return m

    def after_update(self, step: int) -> dict:
        version = step + 1
        self.policy.version = version
        publish_s = self.weights.publish(version)
        self._dispatch_upto(version + self.lag)
        self._exchange_jobs()
        cycle = time.perf_counter() - self._cycle_t0
        return {"pipeline/weight_publish_s": publish_s,
                "pipeline/learner_wait_frac": self._wait_s / max(cycle, 1e-9)}

    def position_at(self, step: int) -> int:
        return self.step_position.get(step, self.stream.position)

    def close(self) -> None:
        self.pool.close()
        self.weights.close()
