"""One learner's updates alone, on synthetic episodes shaped like a game's or the main job's: each update's
padded tokens, passes, seconds, the resident memory left after it and the process's peak (VmHWM) so far.

    python -m nanorllm.bench.update_memory game --updates 3     # SmolLM2-135M's shape, random weights, bf16
    python -m nanorllm.bench.update_memory game --dtype fp32   # fp32 (a CPU without bf16 units computes fp32)
    python -m nanorllm.bench.update_memory math --updates 3
    MALLOC_MMAP_THRESHOLD_=4194304 python -m nanorllm.bench.update_memory game   # an allocator setting, side by side
    python -m nanorllm.bench.update_memory game --quick         # a 2-layer toy: checks that it runs

`game`: 14 tasks x 4 episodes of 1-5 turns, a first prompt of 480-620 tokens, replies of 30-64 and 60-140 tokens of
feedback a turn (rows of up to ~1,600 tokens, none sharing a prefix: a TicTacToe learner's). `math`: 4 x 8 episodes
of 1-2 turns over prompts of 90-130 tokens (the main job's). Every group carries a gradient (no silent group is
dropped), so each update trains every episode; each update draws new episodes (other lengths), as a run's do. The
process does nothing else, so its peak is the update's: compare it with the plan's update parts (weights, grads,
AdamW, activations; docs/memory.md).
"""

import argparse
import random
import sys
import time

import torch

from nanorllm.bench.gpu_learner import update_setup
from nanorllm.bench.rss import peak_rss_bytes, rss_now_bytes
from nanorllm.core.types import RolloutResult, StepSample, Trajectory
from nanorllm.trainer.step import train_step

# (tasks, episodes a task, first prompt, turns, reply, feedback): ranges drawn per episode or turn, or a fixed count
SHAPES = {"game": (14, 4, (480, 620), (1, 5), (30, 64), (60, 140)),
          "math": (4, 8, (90, 130), (1, 2), (10, 32), 15)}
QUICK = {"game": (2, 2, (48, 62), (1, 5), (3, 6), (6, 14)), "math": (2, 2, (9, 13), (1, 2), (1, 3), 2)}


def draw(rng: random.Random, span: tuple[int, int] | int) -> int:
    return span if isinstance(span, int) else rng.randint(*span)


def episodes(shape: tuple, seed: int, vocab: int = 256) -> list[RolloutResult]:
    tasks, per_task, prompt, turns, reply, feedback = shape
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        question = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))]
        for k in range(per_task):
            ids, steps = list(question), []
            for turn in range(rng.randint(*turns)):
                n = rng.randint(*reply)
                response = [rng.randrange(3, vocab) for _ in range(n)]
                steps.append(StepSample(task_id=f"t{t}", episode_id=f"t{t}#{k}", turn=turn, prompt_ids=list(ids),
                                        response_ids=response, rollout_logprobs=[-2.0] * n))
                ids = ids + response + [rng.randrange(3, vocab) for _ in range(draw(rng, feedback))]
            reward = float(rng.random() < 0.5)
            for s in steps:
                s.reward = reward
            out.append(RolloutResult(trajectory=Trajectory(task_id=f"t{t}", final_reward=reward), step_samples=steps))
    return out


def run(kind: str, updates: int, *, quick: bool = False, dtype: str = "bf16") -> list[dict]:
    """`updates` train_steps on `kind`'s episodes (each its own draw) at `dtype` (bf16 or fp32); a row per update."""
    policy, cfg, opt = update_setup("cpu", dtype, quick=quick)
    rows = []
    for i in range(updates):
        results = episodes((QUICK if quick else SHAPES)[kind], seed=i)
        t0 = time.perf_counter()
        m = train_step(policy, opt, results, cfg)
        rows.append({"update": i, "samples": m["train/samples"], "padded_tokens": int(m["train/padded_tokens"]),
                     "passes": int(m["perf/micro_batches"]), "seconds": time.perf_counter() - t0,
                     "resident_after_gb": rss_now_bytes() / 1e9,
                     "peak_gb": peak_rss_bytes() / 1e9})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=sorted(SHAPES))
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a 2-layer toy model and small episodes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    args = ap.parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    print(f"{args.kind}: {'toy model' if args.quick else 'SmolLM2-135M shape, random weights'}, {args.dtype}, CPU, "
          f"{args.threads} threads; resident before {rss_now_bytes() / 1e9:.2f} GB", flush=True)
    for r in run(args.kind, args.updates, quick=args.quick, dtype=args.dtype):
        print(f"update {r['update']}: {r['samples']} samples, {r['padded_tokens']} padded tokens in {r['passes']} passes,"
              f" {r['seconds']:.1f} s, resident after {r['resident_after_gb']:.2f} GB, peak {r['peak_gb']:.2f} GB",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
