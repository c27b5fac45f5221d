"""`launch/bench.py --gpu --dry-run`: the GPU benchmark's every measurement runs (on CPU, tiny sizes)."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_gpu_bench_dry_run_writes_every_figure(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "launch/bench.py", "--gpu", "--dry-run", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())["figures"]
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
