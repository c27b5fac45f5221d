"""PipelineSource: the learner's side of the actor/learner pipeline.

The training loop (trainer/loop.py) is the same as in serial mode; only where a step's episodes
come from changes. Here:

- step s's groups are cut into one job per worker (a group never spans workers, so it arrives
  whole) and dispatched ahead of time: jobs for steps up to v + max_policy_lag are out while the
  learner holds version v. A job for step s carries min_version = s - max_policy_lag; a worker
  does not start it on older weights. lag 0 = synchronous, lag 1 = the next batch is generated
  while this one trains.
- after each update the learner publishes the weights (version + 1) and dispatches the next step.
- a batch whose version still lags more than the bound is dropped, counted and re-issued.
- a dead worker is restarted and its unfinished jobs re-issued; a job's result is used once
  (a late duplicate is discarded), so no group is lost or trained twice.
"""

import signal
import time

from nanorllm.pipeline.pool import WorkerPool
from nanorllm.pipeline.weights import SharedWeights


def split_stale(results: list, learner_version: int, max_lag: int) -> tuple[list, list]:
    """(fresh, stale): stale = sampled by weights more than max_lag versions behind the learner."""
    fresh = [r for r in results if learner_version - r.policy_version <= max_lag]
    stale = [r for r in results if learner_version - r.policy_version > max_lag]
    return fresh, stale


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class PipelineSource:
    MAX_JOB_ATTEMPTS = 3

    def __init__(self, run):
        from nanorllm.trainer.loop import rollout_seed

        self.run, self.cfg = run, run.cfg
        self.rollout_seed = rollout_seed
        self.lag = run.cfg.max_policy_lag
        # The one allocation of the shared buffer; on CPU the learner's parameters move into it.
        self.weights = SharedWeights(run.policy.model, run.optimizer, version=run.start_step)
        run.policy.version = run.start_step
        n = len(run.devices.workers)
        self.pool = WorkerPool(self.cfg, self.weights, run.devices.workers, threads=self.cfg.threads,
                               num_processes=n + 1)
        self.outstanding: dict[str, dict] = {}  # job_id -> job, dispatched and not yet returned
        self.owner: dict[str, int] = {}  # job_id -> worker id it was given to
        self.attempts: dict[str, int] = {}
        self.done: dict[str, dict] = {}  # job_id -> message, returned and not yet trained on
        self.specs: dict[str, dict] = {}  # job_id -> job, kept until its step is trained
        self.step_jobs: dict[int, list[str]] = {}
        self.step_position: dict[int, int] = {}  # task-stream position before step s was drawn
        self.totals = {"stale_dropped": 0, "worker_restarts": 0, "job_errors": 0, "duplicates": 0}
        self.next_step = run.start_step
        self._wait_s, self._cycle_t0, self._msgs = 0.0, time.perf_counter(), []
        self._dispatch_upto(run.start_step + self.lag)

    # ---- dispatch ------------------------------------------------------------------------------
    def _dispatch_upto(self, last_step: int) -> None:
        while self.next_step <= min(last_step, self.cfg.max_steps - 1):
            self._dispatch_step(self.next_step)
            self.next_step += 1

    def _dispatch_step(self, step: int) -> None:
        self.step_position[step] = self.run.stream.position
        picked = self.run.stream.take(self.cfg.tasks_per_step)
        n_parts = min(len(self.pool.procs) or 1, len(picked))
        size = -(-len(picked) // n_parts)
        ids = []
        for part in range(n_parts):
            chunk = picked[part * size:(part + 1) * size]
            if not chunk:
                continue
            job = {"job_id": f"{step}.{part}", "step": step, "tasks": [t for t, _ in chunk],
                   "group_ids": [g for _, g in chunk], "num_samples": self.cfg.num_samples_per_task,
                   "seed": self.rollout_seed(self.cfg, step) + 7919 * part,
                   "min_version": max(0, step - self.lag)}
            ids.append(job["job_id"])
            self._submit(job)
        self.step_jobs[step] = ids

    def _submit(self, job: dict, exclude: int | None = None) -> None:
        load = {wid: 0 for wid in self.pool.procs}
        for jid, wid in self.owner.items():
            if jid in self.outstanding and wid in load:
                load[wid] += 1
        candidates = [w for w in load if w != exclude] or list(load)
        wid = min(candidates, key=lambda w: (load[w], w))
        self.outstanding[job["job_id"]] = job
        self.specs[job["job_id"]] = job
        self.owner[job["job_id"]] = wid
        self.attempts[job["job_id"]] = self.attempts.get(job["job_id"], 0) + 1
        self.pool.submit(wid, job)

    # ---- receive -------------------------------------------------------------------------------
    def _handle(self, msg: dict) -> None:
        kind = msg["kind"]
        if kind == "ready":
            self._msgs.append(msg)
            return
        jid = msg["job_id"]
        if jid not in self.outstanding:  # already returned by an earlier attempt
            self.totals["duplicates"] += 1
            return
        if kind == "error":
            self.totals["job_errors"] += 1
            print(f"[pipeline] worker {msg['worker_id']} failed job {jid}:\n{msg['error']}", flush=True)
            job = self.outstanding.pop(jid)
            if self.attempts[jid] >= self.MAX_JOB_ATTEMPTS:
                raise RuntimeError(f"job {jid} failed {self.attempts[jid]} times; last error above")
            self._submit(job, exclude=msg["worker_id"])
            return
        self.outstanding.pop(jid)
        self.done[jid] = msg
        self._msgs.append(msg)

    def _check_workers(self) -> None:
        for wid, code in self.pool.dead():
            lost = [jid for jid, w in self.owner.items() if w == wid and jid in self.outstanding]
            print(f"[pipeline] worker {wid} died ({_exit_reason(code)}); restarting it and re-issuing "
                  f"{len(lost)} job(s): {lost}", flush=True)
            self.pool.restart(wid)
            self.totals["worker_restarts"] += 1
            for jid in lost:
                self._submit(self.outstanding.pop(jid))

    def _collect(self, job_ids: list[str]) -> bool:
        while not all(j in self.done for j in job_ids):
            if self.run.stop_requested:
                return False
            for msg in self.pool.poll(timeout=0.2):
                self._handle(msg)
            self._check_workers()
        return True

    # ---- the RolloutSource interface -------------------------------------------------------------
    def next_batch(self, step: int):
        t0 = time.perf_counter()
        self._cycle_t0 = t0
        version = self.run.policy.version
        pending, results = list(self.step_jobs[step]), []
        while pending:
            if not self._collect(pending):
                return None, {}
            stale_jobs = []
            for jid in pending:  # one job = one weights version, so it is all fresh or all stale
                fresh, stale = split_stale(self.done.pop(jid)["results"], version, self.lag)
                results.extend(fresh)
                if stale:
                    self.totals["stale_dropped"] += len(stale)
                    stale_jobs.append(jid)
            for jid in stale_jobs:  # the same groups again, on current weights
                self._submit({**self.specs[jid], "min_version": version})
            pending = stale_jobs
        for jid in self.step_jobs.pop(step):  # a late duplicate of these is now recognised as one
            self.owner.pop(jid, None)
            self.specs.pop(jid, None)
            self.attempts.pop(jid, None)
        self._wait_s = time.perf_counter() - t0
        return results, self._batch_metrics(results, version)

    def _batch_metrics(self, results: list, version: int) -> dict:
        lags = [version - r.policy_version for r in results]
        msgs = [m for m in self._msgs if m["kind"] == "result"]
        self._msgs = [m for m in self._msgs if m["kind"] != "result"]
        m = {
            "pipeline/policy_lag_mean": sum(lags) / max(len(lags), 1),
            "pipeline/policy_lag_max": max(lags, default=0),
            "pipeline/stale_dropped": self.totals["stale_dropped"],
            "pipeline/queue_depth": self.pool.queue_depth(),
            "pipeline/worker_restarts": self.totals["worker_restarts"],
            "pipeline/job_errors": self.totals["job_errors"],
        }
        wall = sum(x["wall_s"] for x in msgs)
        if wall > 0:
            m["pipeline/worker_wait_frac"] = sum(x["weight_wait_s"] + x["queue_wait_s"] for x in msgs) / wall
            m["pipeline/worker_idle_frac"] = sum(x["idle_s"] for x in msgs) / wall
        loads = sum(x["loads"] for x in msgs)
        if loads:
            m["pipeline/weight_load_s"] = sum(x["load_s"] for x in msgs) / loads
        total_rate = 0.0
        for x in msgs:
            tokens = x["results"][0].timings["gen_tokens"] if x["results"] else 0
            rate = tokens / max(x["rollout_s"], 1e-9)
            m[f"pipeline/worker{x['worker_id']}/gen_tokens_per_s"] = rate
            total_rate += rate
        m["perf/gen_tokens_per_s"] = total_rate
        m["perf/rollout_s"] = max((x["rollout_s"] for x in msgs), default=0.0)
        return m

    def after_update(self, step: int) -> dict:
        version = step + 1
        self.run.policy.version = version
        publish_s = self.weights.publish(version)
        self._dispatch_upto(version + self.lag)
        cycle = time.perf_counter() - self._cycle_t0
        return {"pipeline/weight_publish_s": publish_s,
                "pipeline/learner_wait_frac": self._wait_s / max(cycle, 1e-9)}

    def position_at(self, step: int) -> int:
        return self.step_position.get(step, self.run.stream.position)

    def close(self) -> None:
        self.pool.close()
        self.weights.close()
