"""The actor/learner pipeline as users run it: real processes. Faults and signals: test_faults.py."""

import pickle
from collections import Counter
from pathlib import Path

import pytest

from nanorllm.core.types import RolloutResult, Trajectory
from nanorllm.pipeline.learner import PipelineSource, split_stale
from nanorllm.pipeline.messages import Fatal, Job, JobDone, JobFailed, JobTimes, Ready
from tests.procs import read_rollouts, read_scalars, run_train


def _trained_groups(run_dir) -> Counter:
    return Counter(r["group_id"] for r in read_rollouts(run_dir))


@pytest.mark.slow
def test_two_worker_run_finishes_and_cleans_up(pipeline_run):
    """The shared 2-worker run (tests/runs.py), which also waited for its last process to be gone."""
    out = pipeline_run["output"]
    assert pipeline_run["rc"] == 0, out
    run = Path(pipeline_run["run"])
    assert "step 4/4" in out and "[done]" in out
    groups = _trained_groups(run)
    assert len(groups) == 4 * 4 and set(groups.values()) == {2}  # every group once, whole
    assert {r["worker_id"] for r in read_rollouts(run)} == {0, 1}
    scalars = read_scalars(run)
    for tag in ["pipeline/policy_lag_mean", "pipeline/policy_lag_max", "pipeline/stale_dropped",
                "pipeline/ready_batches", "pipeline/learner_wait_frac", "pipeline/worker_wait_frac",
                "pipeline/weight_publish_s", "pipeline/worker_restarts", "pipeline/worker_hangs", "pipeline/mismatch_kl",
                "perf/episodes_per_s", "perf/gen_tokens_per_s", "perf/train_tokens_per_s",
                "perf/decode_useful_frac"]:
        assert tag in scalars, tag
    assert max(v for _, v in scalars["pipeline/policy_lag_max"]) <= 1
    assert all(v == 1.0 for _, v in scalars["perf/decode_useful_frac"])  # finished rows leave the batch
    assert pipeline_run["procs_left"] == [], "child processes outlived the launcher"
    assert pipeline_run["shm_left"] == [], "shared-memory segments left in /dev/shm"
    assert pipeline_run["tmp_left"] == [], "files left in the temporary folder"  # the fork server's socket folder


def _serial_and_pipeline_agree(tmp_path, *extra: str, steps: int = 2) -> tuple[dict, dict]:
    """Serial and pipeline (lag 0) runs: the same episodes, the same losses; returns both runs' scalars."""
    common = ["--max-steps", str(steps), "--seed", "3", "--no-drop-zero-std-groups", "--max-new-tokens", "6", *extra]
    rc1, out1, _ = run_train([*common, "--serial", "--run-name", "s"], tmp_path)
    rc2, out2, _ = run_train([*common, "--num-workers", "1", "--max-policy-lag", "0", "--run-name", "p"], tmp_path)
    assert rc1 == 0 and rc2 == 0, out1 + out2
    key = lambda r: r["group_id"] + str(r["turns"])  # noqa: E731
    serial = sorted(read_rollouts(tmp_path / "s"), key=key)
    pipe = sorted(read_rollouts(tmp_path / "p"), key=key)
    assert [(r["group_id"], [t["response"] for t in r["turns"]]) for r in serial] == \
           [(r["group_id"], [t["response"] for t in r["turns"]]) for r in pipe]
    s1, p1 = read_scalars(tmp_path / "s"), read_scalars(tmp_path / "p")
    for tag in ["loss/policy", "entropy", "completions/mean_length"]:
        for (_, a), (_, b) in zip(s1[tag], p1[tag], strict=True):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6), tag
    assert all(v == 0 for _, v in p1["pipeline/policy_lag_max"])
    return s1, p1


@pytest.mark.slow
def test_serial_and_synchronous_pipeline_agree(tmp_path):
    _serial_and_pipeline_agree(tmp_path)


LENGTH_RULE_ENV = """
import nanorllm.envs.math_env as math_env
from nanorllm.envs.grader import Verdict
from nanorllm.envs.math_env import MathSelfRefine

math_env.judge = lambda response, gold, **kw: Verdict(sum(map(ord, response)) % 2 == 0, "x")


class LengthRule(MathSelfRefine):
    \"\"\"Math self-refine whose grader the tiny random model can meet: rewards differ within groups.\"\"\"
"""


@pytest.mark.slow
def test_serial_and_synchronous_pipeline_agree_with_lora_adapters_that_train(tmp_path):
    """Workers hold only the adapters the learner publishes: their episodes after each update are the
    serial run's, token for token, at lag 0."""
    env = tmp_path / "length_rule.py"
    env.write_text(LENGTH_RULE_ENV)
    s1, p1 = _serial_and_pipeline_agree(tmp_path, "--lora-rank", "4", "--lr", "1e-2", "--env", f"{env}:LengthRule",
                                        steps=3)
    assert any(v > 0 for _, v in s1["grad_norm"])  # the adapters really moved between the compared rollouts
    assert len(p1["pipeline/weight_publish_s"]) == 3
def _result(version: int) -> RolloutResult:
    return RolloutResult(trajectory=Trajectory(task_id="t"), step_samples=[], policy_version=version)


def test_split_stale_drops_beyond_the_lag_bound():
    results = [_result(v) for v in (5, 4, 3, 2)]
    fresh, stale = split_stale(results, learner_version=5, max_lag=1)
    assert [r.policy_version for r in fresh] == [5, 4]
    assert [r.policy_version for r in stale] == [3, 2]
    fresh, stale = split_stale(results, learner_version=5, max_lag=0)
    assert [r.policy_version for r in fresh] == [5] and len(stale) == 3


class _Pool:
    """Two live workers; records what the learner submits."""

    devices = ["cpu", "cpu"]

    def __init__(self):
        self.sent = []

    def up(self) -> list[int]:
        return [0, 1]

    def submit(self, wid: int, job: Job) -> None:
        self.sent.append((wid, job))


def _learner() -> PipelineSource:
    """The learner's message handling alone: no run, no processes."""
    src = PipelineSource.__new__(PipelineSource)
    src.pool, src.ready, src.last_error, src.holding, src.capture_s = _Pool(), set(), {}, False, 0.0  # training has begun
    src.outstanding, src.owner, src.attempts, src.done, src.specs = {}, {}, {}, {}, {}
    src.failures, src.totals, src.longest_job_s, src._msgs = {0: 0, 1: 0}, Counter(), 0.0, []
    return src


def test_typed_worker_messages_drive_the_learner():
    src = _learner()
    job = Job(job_id="3.0", step=3, tasks=[{"task_id": "t"}], group_ids=["t@0"], num_samples=2, seed=1, min_version=2)
    for wid in (0, 1):
        src._handle(Ready(worker_id=wid, version=0, load_s=0.1))
    src._submit(job)
    assert src.ready == {0, 1} and src.pool.sent == [(0, job)]
    src._handle(JobFailed(job_id="3.0", worker_id=0, version=2, error="boom"))
    assert src.totals["job_errors"] == 1 and src.pool.sent[-1] == (1, job)  # re-issued to the other worker
    done = JobDone(job_id="3.0", worker_id=1, version=2, results=[_result(2)],
                   times=JobTimes(wall_s=2.0, idle_s=0.5, weight_wait_s=0.25, queue_wait_s=0.25, rollout_s=1.0))
    src._handle(done)
    src._handle(done)  # a late duplicate
    assert src.done == {"3.0": done} and src.totals["duplicates"] == 1 and src.longest_job_s == 1.0
    src._handle(Fatal(worker_id=0, error="Traceback ..."))
    assert src.last_error == {0: "Traceback ..."}
    assert pickle.loads(pickle.dumps(done)) == done  # what the pipes carry
