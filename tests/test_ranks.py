"""Learner ranks: the batch split, and an N-rank step equal to the 1-rank step on the same batch."""

from launch.learner_ranks import steps_on_ranks
from nanorllm.dist.split import episode_tokens, split_groups
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


def test_two_ranks_step_equals_one_rank_step(tiny_policy):
    """Whole groups on two gloo ranks, a global normaliser and DDP's averaged gradients give the
    1-rank update: AdamW at lr 1e-2 moves weights by ~1e-2, the two agree within 1e-5. Cases:
    token-mean over micro-batches, seq-mean, and one group only (rank 1 trains nothing)."""
    results = build_results(tiny_policy)
    one_group = build_results(tiny_policy, rewards={"g0": [1.0, 0.0, 0.0, 1.0]}, two_turns={("g0", 1)})
    cases = [(config(loss_agg="token-mean", micro_batch_tokens=40), results),
             (config(loss_agg="seq-mean", micro_batch_tokens=4096), results),
             (config(), one_group),
             (config(), [])]  # nothing to train: the initial weights
    one = steps_on_ranks(1, cases)
    two = steps_on_ranks(2, cases)
    start = one[-1]["params"]
    for a, b in zip(one, two):
        assert float((a["params"] - b["params"]).abs().max()) <= 1e-5
    for a in one[:-1]:
        assert float((a["params"] - start).abs().max()) > 1e-3
