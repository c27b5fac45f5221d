"""The actor/learner pipeline as users run it: real processes. Faults and signals: test_faults.py."""

import time
from collections import Counter

import pytest

from nanorllm.core.types import RolloutResult, Trajectory
from nanorllm.pipeline.learner import split_stale
from tests.procs import processes_with_token, read_rollouts, read_scalars, run_train, shm_entries


def _assert_clean_exit(token: str, shm_before: set[str]) -> None:
    deadline = time.time() + 15
    while processes_with_token(token) and time.time() < deadline:
        time.sleep(0.2)
    assert processes_with_token(token) == [], "child processes outlived the launcher"
    assert shm_entries() - shm_before == set(), "shared-memory segments left in /dev/shm"


def _trained_groups(run_dir) -> Counter:
    return Counter(r["group_id"] for r in read_rollouts(run_dir))


def test_two_worker_run_finishes_and_cleans_up(tmp_path):
    shm_before = shm_entries()
    rc, out, token = run_train(["--num-workers", "2", "--max-steps", "4", "--run-name", "p2"], tmp_path)
    assert rc == 0, out
    run = tmp_path / "p2"
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
    _assert_clean_exit(token, shm_before)


def test_serial_and_synchronous_pipeline_agree(tmp_path):
    common = ["--max-steps", "2", "--seed", "3", "--no-drop-zero-std-groups", "--max-new-tokens", "6"]
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
        assert s1[tag][0][1] == pytest.approx(p1[tag][0][1], rel=1e-4, abs=1e-6), tag
    assert all(v == 0 for _, v in p1["pipeline/policy_lag_max"])


def _result(version: int) -> RolloutResult:
    return RolloutResult(trajectory=Trajectory(task_id="t"), step_samples=[], policy_version=version)


def test_split_stale_drops_beyond_the_lag_bound():
    results = [_result(v) for v in (5, 4, 3, 2)]
    fresh, stale = split_stale(results, learner_version=5, max_lag=1)
    assert [r.policy_version for r in fresh] == [5, 4]
    assert [r.policy_version for r in stale] == [3, 2]
    fresh, stale = split_stale(results, learner_version=5, max_lag=0)
    assert [r.policy_version for r in fresh] == [5] and len(stale) == 3
