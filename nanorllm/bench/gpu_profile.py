"""Where the time of the two hot loops goes, by kernel: `python -m nanorllm.bench.gpu_profile [cuda|cpu] [--quick]`.

Two `torch.profiler` tables each, sorted by device time and by host time, with their totals beside the wall time:
  update   one bf16 `train_step` of the learner benchmark's 256 synthetic episodes (bench/gpu_learner.py: the default
           model's shape at random weights), after two warm-up steps
  decode   five graph-replayed decode steps at 256 rows of `preset:smollm2-135m` in bf16, after five warm-up steps
The GPU's kernel time against the wall time says whether a loop is bound by the device or by the host issuing its
kernels (docs/learner-update.md and docs/decode-engine.md read these tables). `--quick`: a toy model and 4 rows,
a dry run of the script that works on CPU; its numbers mean nothing. The profiler adds its own host time.
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from nanorllm.bench import gpu_learner
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.step import train_step
from nanorllm.utils.devices import synchronize



def report(name: str, prof, wall_s: float, device: str, rows: int = 22) -> str:
    """The loop's totals and its two tables."""
    events = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
    host_ms = sum(e.self_cpu_time_total for e in events) / 1e3
    head = f"===== {name}: wall {wall_s * 1e3:.1f} ms, host {host_ms:.1f} ms, GPU kernels {gpu_ms:.1f} ms"
    by_device = events.table(sort_by="self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total",
                             row_limit=rows, max_name_column_width=70)
    return "\n".join([head, by_device, events.table(sort_by="self_cpu_time_total", row_limit=15,
                                                    max_name_column_width=70)])


def profile_update(device: str, quick: bool) -> str:
    sizes = gpu_learner.QUICK_SIZES if quick else {}
    policy, cfg, optimizer = gpu_learner.update_setup(device, "bfloat16", quick=quick)
    for _ in range(2):
        train_step(policy, optimizer, gpu_learner.synthetic_results(vocab=256, **sizes), cfg)
        synchronize(device)
    results = gpu_learner.synthetic_results(vocab=256, **sizes)
    with profile(activities=activities(device)) as prof:
        t0 = time.perf_counter()
        train_step(policy, optimizer, results, cfg)
        synchronize(device)
        wall = time.perf_counter() - t0
    return report(f"bf16 update, {len(results)} episodes", prof, wall, device)


def profile_decode(device: str, quick: bool) -> str:
    policy = HFCausalPolicy.from_name("tiny-random" if quick else "preset:smollm2-135m", device=device,
                                      dtype="float32" if quick else "bfloat16", replica=True)
    prompt = policy.first_prompt_ids([{"role": "user", "content": "What is 12 + 7?"}])
    rows, steps = (4, 5) if quick else (256, 5)
    params = SamplingParams(max_new_tokens=10_000, temperature=1.0, ignore_eos=True)
    with policy.decode_batch(params, slots=rows + 1, width=len(prompt) + 64) as batch:
        batch.join([(i, prompt, torch.Generator().manual_seed(i), None) for i in range(rows)])
        for _ in range(steps):  # the graph of this bucket is captured here
            batch.step()
        synchronize(device)
        with profile(activities=activities(device)) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                batch.step()
            synchronize(device)
            wall = time.perf_counter() - t0
    return report(f"{steps} decode steps at {rows} rows", prof, wall, device)


def activities(device: str) -> list:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])


def main(argv: list[str]) -> int:
    device = next((a for a in argv if not a.startswith("--")), "cuda" if torch.cuda.is_available() else "cpu")
    quick = "--quick" in argv or device == "cpu"
    for part in (profile_update, profile_decode):
        print(part(device, quick), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
