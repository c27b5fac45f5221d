"""Learner ranks: the batch split, an N-rank step equal to the 1-rank step on the same batch, and
whole runs with a rank killed or a device that does not exist."""

import subprocess
import sys
import uuid

import pytest

from nanorllm.bench.learner_ranks import steps_on_ranks
from nanorllm.faultsuite import suite
from nanorllm.faultsuite.ledger import groups_of, leftovers, read_rollouts
from nanorllm.faultsuite.process import TRAIN_SCRIPT, child_env
from tests.runs import TINY_ARGS
from nanorllm.ranks.split import episode_tokens, split_groups
from nanorllm.ranks.group import free_port
from tests.procs import run_train
from tests.test_train_step import build_results, config


def test_split_keeps_groups_whole_and_balances_tokens(tiny_policy):
    results = build_results(tiny_policy, rewards={f"g{i}": [1.0, 0.0] * (i + 1) for i in range(5)}, two_turns=set())
    shares = split_groups(results, 2)
    assert sorted(id(r) for s in shares for r in s) == sorted(id(r) for r in results)
    owners = {}
    for k, share in enumerate(shares):
        for r in share:
            assert owners.setdefault(r.group_id or r.task_id, k) == k  # a group never spans ranks
        assert [results.index(r) for r in share] == sorted(results.index(r) for r in share)
    loads = [sum(episode_tokens(r) for r in s) for s in shares]
    biggest_group = max(sum(episode_tokens(r) for r in results if r.task_id == f"g{i}") for i in range(5))
    assert abs(loads[0] - loads[1]) <= biggest_group


def test_more_ranks_than_groups_leaves_empty_shares(tiny_policy):
    results = build_results(tiny_policy, rewards={"g0": [1.0, 0.0]}, two_turns=set())
    shares = split_groups(results, 3)
    assert sorted(len(s) for s in shares) == [0, 0, 2]


@pytest.mark.slow
def test_two_ranks_step_equals_one_rank_step(tiny_policy):
    """Whole groups on two gloo ranks, a global normaliser and DDP's averaged gradients give the
    1-rank update: AdamW at lr 1e-2 moves weights by ~1e-2, the two agree within 1e-5. Cases:
    token-mean over micro-batches, seq-mean, and one group only (rank 1 trains nothing). These run
    the full forward (train mode); the default shared-prompt-prefix forward is checked last, within
    1e-4: each rank shares the prefix of its own rows, so the sums are rounded in another order, and
    AdamW's first step (g / |g|) magnifies that where a gradient is near zero."""
    results = build_results(tiny_policy)
    one_group = build_results(tiny_policy, rewards={"g0": [1.0, 0.0, 0.0, 1.0]}, two_turns={("g0", 1)})
    full = {"disable_dropout": False}  # train mode (the tiny model has no dropout): no shared prefix
    cases = [(config(loss_agg="token-mean", micro_batch_tokens=40, **full), results, 1e-5),
             (config(loss_agg="seq-mean", micro_batch_tokens=4096, **full), results, 1e-5),
             (config(**full), one_group, 1e-5),
             (config(micro_batch_tokens=4096), results, 1e-4),  # the shared-prefix forward
             (config(), [], 0.0)]  # nothing to train: the initial weights
    one = steps_on_ranks(1, [c[:2] for c in cases])
    two = steps_on_ranks(2, [c[:2] for c in cases])
    start = one[-1]["params"]
    for a, b, (_, _, tol) in zip(one, two, cases):
        assert float((a["params"] - b["params"]).abs().max()) <= tol
    for a in one[:-1]:
        assert float((a["params"] - start).abs().max()) > 1e-3


# ---- whole runs ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fault", [suite.rank_kill, suite.rank_hang])
def test_a_killed_or_hung_rank_stops_the_run_with_a_checkpoint_and_resume_takes_another_rank_count(tmp_path, fault):
    """SIGKILL (or SIGSTOP, with --learner-timeout-s 10) learner rank 1 mid-run: one error naming it, exit 1,
    the last completed step saved, nothing left running; the run resumes on one rank and finishes with every
    group trained exactly once."""
    stopped, resumed = fault(tmp_path)
    assert stopped.ok, stopped.notes + [stopped.output[-3000:]]
    assert "RankError: learner rank 1 on cpu (pid " in stopped.output
    if fault is suite.rank_hang:
        assert 9 <= stopped.detected_s <= 60  # the collective's timeout, not a hang
    assert resumed.ok, resumed.notes + [resumed.output[-3000:]]


@pytest.mark.slow
def test_a_learner_device_that_does_not_exist_is_refused_by_name(tmp_path):
    rc, out, _ = run_train(["--serial", "--learner-devices", "cuda:5", "--run-name", "bad"], tmp_path)
    assert rc == 2, out
    assert "learner_devices: cuda:5 requested but CUDA is not available" in out
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.slow
def test_two_nodes_on_localhost_train_every_group_once_with_both_nodes_workers(tmp_path):
    """torchrun --nnodes 2 on one box (gloo): node 1's leader runs its own worker on the tasks rank 0
    sends it; its episodes reach rank 0 over the process group. Both exit 0, nothing is left."""
    token, port = uuid.uuid4().hex, free_port()
    env = child_env(token)
    args = [*TINY_ARGS, "--num-workers", "1", "--rollout-dump-size", "100000", "--max-steps", "4",
            "--output-dir", str(tmp_path), "--run-name", "nodes", "--learner-timeout-s", "120"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port)]
    nodes = [subprocess.Popen([*torchrun, "--node-rank", str(k), str(TRAIN_SCRIPT), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    outs = [p.communicate(timeout=400)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "step 4/4" in outs[0] and "[ranks] 2 learner ranks" in outs[0]
    assert groups_of(tmp_path / "nodes") == (0, 0, 4)
    by_step = {}
    for rec in read_rollouts(tmp_path / "nodes"):
        by_step.setdefault(rec["step"], set()).add(rec["worker_id"])
    assert by_step == {s: {0, 1000} for s in range(1, 5)}  # node 0's worker 0 and node 1's worker 0, every step
    assert leftovers(token, set())[0] == 0
