"""The learner's update at the device's pace: tokens/s and model FLOPs utilisation per precision.

One `train_step` on a synthetic 256-episode batch of realistic lengths (32 tasks x 8 episodes, 2 turns,
a ~100-token prompt of which the first 80 are the shared template, ~60-token responses) with the
default model's architecture (SmolLM2-135M: hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate
1536, vocab 49152, tied embeddings) at random weights: nothing is downloaded, and the update's cost
does not depend on the weights' values. Rewards alternate so every group carries a gradient.

MFU = 6 x parameters x tokens / seconds / peak, the usual estimate of a forward and backward: tokens
are the batch's real (unpadded) sequence tokens. It overstates the work actually done a little (the
shared template is computed once per micro-batch, the head runs only at scored positions), so it is
a figure to compare precisions and changes by, not a hardware counter. Peaks are the dense figures
of the card (H100/H200: fp32 ~67 TFLOP/s, TF32 ~495, bf16 ~990); elsewhere the peak is unknown and
MFU is not given.
"""

import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nanorllm.core.types import RolloutResult, StepSample, Trajectory
from nanorllm.utils.devices import synchronize

PEAK_TFLOPS = {"H200": {"fp32": 67.0, "tf32": 495.0, "bf16": 990.0},
               "H100": {"fp32": 67.0, "tf32": 495.0, "bf16": 990.0}}
PRECISIONS = {"fp32": ("float32", False), "tf32": ("float32", True), "bf16": ("bfloat16", False)}  # dtype, tf32


def default_architecture(*, quick: bool = False) -> LlamaConfig:
    """SmolLM2-135M's shape (the default model), or a 2-layer toy with `quick`."""
    if quick:
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def synthetic_results(*, tasks: int = 32, samples: int = 8, prompt: int = 100, shared: int = 80,
                      response: int = 60, feedback: int = 15, vocab: int = 256, seed: int = 0) -> list[RolloutResult]:
    """tasks x samples two-turn episodes: prompts of ~`prompt` tokens whose first `shared` are one
    template, responses of `response` +-50%, turn 2's prompt = turn 1's prompt + response + feedback."""
    rng = random.Random(seed)
    template = [rng.randrange(3, vocab) for _ in range(shared)]
    results = []
    for t in range(tasks):
        question = template + [rng.randrange(3, vocab) for _ in range(prompt - shared)]
        for k in range(samples):
            ids, steps = list(question), []
            for turn in range(2):
                n = rng.randint(response // 2, response * 3 // 2)
                out = [rng.randrange(3, vocab) for _ in range(n)]
                steps.append(StepSample(task_id=f"t{t}", episode_id=f"t{t}#{k}", turn=turn, prompt_ids=list(ids),
                                        response_ids=out, rollout_logprobs=[-2.0] * n))
                ids = ids + out + [rng.randrange(3, vocab) for _ in range(feedback)]
            reward = float((t + k) % 2)
            for s in steps:
                s.reward = reward
            results.append(RolloutResult(trajectory=Trajectory(task_id=f"t{t}", final_reward=reward),
                                         step_samples=steps))
    return results


def learner_policy(arch: LlamaConfig, device: str, dtype: str):
    """An HFCausalPolicy over a random-weight model of `arch` (fp32 masters) and the byte tokenizer."""
    from nanorllm.policy.hf_causal import DTYPES, HFCausalPolicy
    from nanorllm.policy.models import tiny_tokenizer

    torch.manual_seed(0)
    model = LlamaForCausalLM(arch)
    return HFCausalPolicy(model, tiny_tokenizer(), device=device, compute_dtype=DTYPES[dtype])


QUICK_SIZES = dict(tasks=4, samples=4, prompt=24, shared=12, response=12, feedback=4)  # the toy run's episodes


def update_setup(device: str, dtype: str, *, tf32: bool = True, quick: bool = False):
    """(policy, config, optimizer) of the benchmark's update at `dtype`: the default model's shape (quick: the
    toy's) at random weights, every group carrying a gradient."""
    from nanorllm.config import TrainConfig
    from nanorllm.trainer.update import make_optimizer

    policy = learner_policy(default_architecture(quick=quick), device, dtype)
    cfg = TrainConfig(model="random", dtype=dtype, tf32=tf32, temperature=1.0, lr=1e-6, drop_zero_std_groups=False)
    return policy, cfg, make_optimizer(policy, cfg)


def peak_tflops(device: str) -> dict | None:
    """The card's dense peaks by precision, or None (CPU, or a card not in PEAK_TFLOPS)."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peaks for card, peaks in PEAK_TFLOPS.items() if card in name), None)


def figures(device: str, quick: bool) -> dict:
    """Update seconds, tokens/s and MFU of one 256-episode train_step per precision (quick: a toy
    model, 16 episodes: a dry check that runs on CPU in seconds, not a measurement)."""
    from nanorllm.trainer.step import train_step

    sizes = QUICK_SIZES if quick else {}
    results = synthetic_results(vocab=256, **sizes)
    peaks = peak_tflops(device)
    out: dict = {"_episodes": len(results), "_device": device}
    print(f"learner update, {'toy model' if quick else 'SmolLM2-135M shape, random weights'}, "
          f"{len(results)} episodes on {device}; peak: {'unknown peak' if peaks is None else peaks}")
    for name, (dtype, tf32) in PRECISIONS.items():
        policy, cfg, opt = update_setup(device, dtype, tf32=tf32, quick=quick)
        params = sum(p.numel() for p in policy.parameters())
        seconds = []
        for _ in range(1 if quick else 3):  # the first is warm-up (allocator, kernels, autotuning)
            results = synthetic_results(vocab=256, **sizes)
            synchronize(device)
            t0 = time.perf_counter()
            m = train_step(policy, opt, results, cfg)
            synchronize(device)
            seconds.append(time.perf_counter() - t0)
        s = min(seconds[1:] or seconds)
        tokens = m["train/padded_tokens"] * (1 - m["perf/pad_frac"])  # real sequence tokens
        mfu = 6 * params * tokens / s / (peaks[name] * 1e12) if peaks else None
        out.update({f"learner_update_s_{name}": s, f"learner_tokens_per_s_{name}": tokens / s,
                    f"learner_mfu_{name}": mfu, "_params": params, "_tokens": tokens,
                    f"_pad_frac_{name}": m["perf/pad_frac"], f"_micro_batches_{name}": m["perf/micro_batches"]})
        print(f"  {name}: update {s:.3f} s, {tokens / s:,.0f} tokens/s, "
              f"MFU {'unknown peak' if mfu is None else f'{mfu:.1%}'}, pad {m['perf/pad_frac']:.1%}, "
              f"{m['perf/micro_batches']} micro-batches")
        del policy, opt
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out
