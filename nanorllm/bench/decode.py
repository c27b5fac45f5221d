"""Rollout figures: batched engine vs one-by-one generate, decode efficiency, eager vs compiled decode."""

import time
from dataclasses import replace

import torch

from nanorllm.config import TrainConfig
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.build import training_engine
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import decode_useful_frac


def bench_rollout_batching(policy: HFCausalPolicy, tasks: list[dict], max_new_tokens: int) -> dict:
    """Same episodes, same forced length (no EOS): one batched engine call vs plain generate, one by one."""
    eos = policy.eos_ids
    policy.eos_ids = []  # every response runs to max_new_tokens
    try:
        engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=max_new_tokens), max_turns=1)
        t0 = time.perf_counter()
        results = engine.run(tasks, num_samples=1, seed=0)
        batched_s = time.perf_counter() - t0
        tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
        t0 = time.perf_counter()
        single_tokens = 0
        for r in results:
            ids = torch.tensor([r.step_samples[0].prompt_ids], device=policy.device)
            out = policy.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                        max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                        pad_token_id=policy.pad_id, top_k=0)
            single_tokens += out.shape[1] - ids.shape[1]
        single_s = time.perf_counter() - t0
    finally:
        policy.eos_ids = eos
    return {"rollout_batching_speedup": (tokens / batched_s) / (single_tokens / single_s),
            "_batched_tokens_per_s": tokens / batched_s, "_single_tokens_per_s": single_tokens / single_s,
            "_episodes": len(tasks), "_batched_tokens": tokens, "_single_tokens": single_tokens}


def bench_decode(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict]) -> dict:
    """One default training step's rollouts, then bare decode forwards at its mean batch and context."""
    from transformers import DynamicCache

    engine = training_engine(policy, cfg)
    engine.run(tasks[:2], num_samples=1, seed=1)  # warm-up
    t0 = time.perf_counter()
    results = engine.run(tasks[:cfg.tasks_per_step], num_samples=cfg.num_samples_per_task, seed=0)
    step_s = time.perf_counter() - t0
    st = results[0].timings
    samples = [s for r in results for s in r.step_samples]
    batch = max(1, round(st["decode_rows"] / max(st["decode_steps"], 1)))
    context = round(sum(len(s.prompt_ids) + len(s.response_ids) / 2 for s in samples) / len(samples))
    steps = cfg.max_new_tokens
    ids = torch.randint(0, len(policy.tokenizer), (batch, context + steps), device=policy.device)
    mask = torch.ones_like(ids)
    pos = torch.arange(context + steps, device=policy.device).expand(batch, -1)
    with policy.decode_batch(SamplingParams()):  # eval mode, no grad, the policy's autocast
        cache = DynamicCache()
        policy.cached_forward(ids[:, :context], mask[:, :context], pos[:, :context], cache)
        t0 = time.perf_counter()
        for t in range(context, context + steps):  # attention over a growing cache, as in sampling
            policy.cached_forward(ids[:, t:t + 1], mask[:, :t + 1], pos[:, t:t + 1], cache)
        bare_s = time.perf_counter() - t0
    gen_per_s, bare_per_s = st["tokens_kept"] / step_s, batch * steps / bare_s
    return {"decode_useful_frac": decode_useful_frac(st),
            "gen_vs_forward": gen_per_s / bare_per_s, "_step_s": step_s, "_tokens_kept": st["tokens_kept"],
            "_decode_rows": st["decode_rows"], "_decode_steps": st["decode_steps"],
            "_prefill_tokens": st["prefill_tokens"], "_reused_tokens": st["reused_tokens"], "_turns": len(samples),
            "_gen_tokens_per_s": gen_per_s, "_bare_forward_tokens_per_s": bare_per_s, "_mean_batch": batch,
            "_mean_context": context}


def bench_compiled_decode(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], repeats: int = 3) -> dict:
    """One default training step's rollouts, eager DecodeBatch vs the static cache with the compiled
    decode step. Each first runs the same step once untimed (the compiled one compiles there, timed
    apart; the eager one goes first, so the process's one-time costs land on its warm-up); then they
    alternate `repeats` times, median kept tokens/s each."""
    tasks = tasks[:cfg.tasks_per_step]
    engines = {flag: training_engine(policy, replace(cfg, compile_decode=flag)) for flag in (False, True)}
    first_s, step_s, runs = {}, {False: [], True: []}, {}
    for flag, engine in engines.items():
        t0 = time.perf_counter()
        engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0)
        first_s[flag] = time.perf_counter() - t0
    for _ in range(repeats):
        for flag, engine in engines.items():
            t0 = time.perf_counter()
            runs[flag] = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0)
            step_s[flag].append(time.perf_counter() - t0)
    median = {flag: sorted(ts)[len(ts) // 2] for flag, ts in step_s.items()}
    per_s = {flag: runs[flag][0].timings["tokens_kept"] / median[flag] for flag in engines}
    episodes = {flag: [[s.response_ids for s in r.step_samples] for r in runs[flag]] for flag in engines}
    return {"compiled_decode_speedup": per_s[True] / per_s[False],
            "_eager_tokens_per_s": per_s[False], "_compiled_tokens_per_s": per_s[True],
            "_eager_step_s": median[False], "_compiled_step_s": median[True],
            "_compile_warmup_s": first_s[True] - median[True], "_eager_warmup_s": first_s[False] - median[False],
            "_tokens_kept": runs[True][0].timings["tokens_kept"], "_decode_steps": runs[True][0].timings["decode_steps"],
            "_repacks": runs[True][0].timings["repacks"],
            "_same_episodes_frac": sum(e == c for e, c in zip(episodes[False], episodes[True])) / len(episodes[True])}
