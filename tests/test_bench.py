"""The benchmark's measuring pieces compare like with like (the figures themselves are timings)."""

import math

import pytest
import torch

from nanorllm.bench.decode import bench_rollout_batching
from nanorllm.bench.pipeline import bench_broadcast
from nanorllm.datasets.tasks import load_tasks


def test_broadcast_is_one_learner_publish_and_one_worker_load(fresh_tiny_policy):
    before = [p.detach().clone() for p in fresh_tiny_policy.model.parameters()]
    out = bench_broadcast(fresh_tiny_policy, repeats=3)
    assert out["_publish_in_place"]  # CPU learner: its parameters are the shared buffer
    assert out["_bytes"] == sum(t.numel() for t in before) * 4
    assert math.isfinite(out["broadcast_vs_copy"]) and out["broadcast_vs_copy"] > 0
    for a, b in zip(before, fresh_tiny_policy.model.parameters()):  # the learner's values survive the move
        assert torch.equal(a, b)


def test_rollout_batching_compares_the_same_number_of_tokens(fresh_tiny_policy):
    tasks = load_tasks("arith:max=20,terms=2,ops=+-,count=50,seed=1", limit=3)
    out = bench_rollout_batching(fresh_tiny_policy, tasks, max_new_tokens=5)
    assert out["_batched_tokens"] == out["_single_tokens"] == 3 * 5
    assert fresh_tiny_policy.eos_ids  # restored after the forced-length run


@pytest.mark.slow
def test_the_distillation_bench_times_both_updates_on_the_same_batch():
    from nanorllm.bench.distill import compare

    r = compare("tiny-random", 1)
    assert r["rl_s"] > 0 and r["distill_s"] > 0 and r["ratio"] == r["distill_s"] / r["rl_s"] and r["tokens"] > 0


@pytest.mark.slow
def test_the_precision_bench_times_fp32_and_bf16_on_the_same_inputs():
    from nanorllm.bench import precision
    from nanorllm.config import TrainConfig

    cfg = TrainConfig(model="tiny-random", tasks_per_step=2, num_samples_per_task=2, max_new_tokens=6,
                      drop_zero_std_groups=False)
    m = precision.matmul_figures(1, "cpu")
    u = precision.update_figures(cfg, 2, "cpu")
    r = precision.rollout_figures(cfg, 1, "cpu")
    assert set(m) == {"matmul_gflops_fp32", "matmul_gflops_bf16"} and all(v > 0 for v in m.values())
    assert set(u) == {"update_s_fp32", "update_s_bf16"} and all(v > 0 for v in u.values())
    assert set(r) == {"rollout_tokens_per_s_fp32", "rollout_tokens_per_s_bf16"} and all(v > 0 for v in r.values())
    k = precision.mismatch_figures(cfg, "cpu")
    assert set(k) == {f"mismatch_{f}_{s}" for f in ("k3", "tokens_per_s") for s in ("fp32", "bf16", "bf16_autocast")}
    # fp32 decode and fp32 scoring differ only in summation order; bf16's roundings are orders of magnitude larger
    assert 0 <= k["mismatch_k3_fp32"] < 1e-3 * k["mismatch_k3_bf16"] and k["mismatch_k3_bf16_autocast"] >= 0
    assert all(k[f"mismatch_tokens_per_s_{s}"] > 0 for s in ("fp32", "bf16", "bf16_autocast"))
