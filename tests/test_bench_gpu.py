"""`launch/bench.py --gpu --dry-run`: the GPU benchmark's every measurement runs (on CPU, tiny sizes)."""

import json
import subprocess
import sys

import pytest

from tests import forked


@pytest.mark.slow
def test_gpu_bench_dry_run_writes_every_figure(tmp_path):
    out = tmp_path / "gpu.json"
    proc = forked.run([sys.executable, "launch/bench.py", "--gpu", "--dry-run", "--json", str(out)],
                      capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    figures = record["figures"]
    assert record["complete"] is True and record["total_s"] > 0
    assert figures["dry_run"] and figures["device"] == "cpu"
    assert figures["versions"]["torch"] == __import__("torch").__version__ and figures["versions"]["transformers"]
    assert 100 < figures["rollout"]["tiny-random"]["decode_context"] < 1000  # mean columns a step read
    assert set(figures["decode_ms"]) == {"eager", "graphs"}
    assert all(ms > 0 for engine in figures["decode_ms"].values() for ms in engine.values())
    roll = figures["rollout"]["tiny-random"]
    assert roll["turns_per_episode"] == 2.0  # fixed-length turns are answered, never cut: two turns each
    assert roll["tokens"] == 2 * 2 * 2 * 6  # tasks x samples x turns x max_new_tokens
    for key in ("tokens_per_s", "upper_bound_tokens_per_s", "hf_generate_tokens_per_s"):
        assert roll[key] > 0, key
    assert roll["graph_steps_frac"] == 0.0 and roll["capture_s"] == 0.0  # no graphs on CPU
    assert figures["eager_rollout_tokens_per_s"] > 0
    assert figures["greedy_same_of_32"] == 4  # of the dry run's 4: eager on both sides on CPU


KILLED_AT_WEIGHTS = """
import os, signal, sys
from nanorllm.bench import gpu, gpu_weights
gpu_weights.figures = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # a time limit's kill, here
sys.exit(gpu.run_gpu_bench(gpu.GpuBenchConfig(dry_run=True, json=sys.argv[1])))
"""


@pytest.mark.slow
def test_a_gpu_bench_killed_before_its_last_figure_keeps_every_figure_it_measured(tmp_path):
    """The bench process is killed (SIGKILL, as `timeout -s KILL` would) when it reaches the weight
    figures, the last ones: the JSON holds every figure before them, parses, and says it is not complete."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_WEIGHTS, str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["complete"] is False and "weights" not in record["figures"]
    figures = record["figures"]
    assert set(figures["decode_ms"]) == {"eager", "graphs"} and figures["greedy_same_of_32"] == 4
    assert figures["rollout"]["tiny-random"]["tokens"] == 2 * 2 * 2 * 6 and figures["learner"]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # no temporary file left beside it


def test_the_replay_bound_counts_live_rows_not_the_idle_prefix_slot(monkeypatch):
    """A step captured over 6 slots for 5 episodes (the 6th slot holds the shared prompt prefix) makes
    5 tokens a replay: 50 replays in one (fake) second are 250 tokens/s, not 300."""
    from types import SimpleNamespace

    from nanorllm.bench import gpu
    from nanorllm.policy.base import SamplingParams
    from nanorllm.policy.decode_graphs import DecodeGraphs
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from test_slot_batch import EagerStepGraph

    policy = HFCausalPolicy.from_name("tiny-random")
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    policy.decode_graphs = DecodeGraphs()
    policy.decode_graphs.graph_type = EagerStepGraph  # CUDA graphs' contract, on CPU
    with policy.decode_batch(params, slots=6, width=128) as batch:
        batch.graphs = policy.decode_graphs
        batch.graphs.capture_all(batch)
        assert {k[0] for k in batch.graphs.graphs} == {6}
        clock = iter(range(1000))
        monkeypatch.setattr(gpu.time, "perf_counter", lambda: float(next(clock)))  # 1 s between two reads
        bound = gpu.replay_bound(policy, SimpleNamespace(sampling=params), {}, rows=5, context=100.0, replays=50)
    assert bound == 5 * 50


@pytest.mark.slow
def test_the_profile_dry_run_prints_both_loops_tables_with_their_totals():
    """`python -m nanorllm.bench.gpu_profile cpu`: the update's and the decode step's tables, each headed by its wall,
    host and kernel totals (no kernels on CPU), with the operators that ran in them."""
    proc = forked.run([sys.executable, "-m", "nanorllm.bench.gpu_profile", "cpu"], capture_output=True, text=True,
                      timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    heads = [line for line in proc.stdout.splitlines() if line.startswith("===== ")]
    assert [h.split(":")[0] for h in heads] == ["===== bf16 update, 16 episodes", "===== 5 decode steps at 4 rows"]
    for head in heads:
        wall, host = (float(head.split(f"{what} ")[1].split(" ms")[0]) for what in ("wall", "host"))
        assert 0 < host and 0 < wall and head.endswith("GPU kernels 0.0 ms")
    assert "aten::mm" in proc.stdout and "Self CPU time total" in proc.stdout
