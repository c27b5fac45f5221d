"""Rollout figures: batched engine vs one-by-one generate, decode efficiency."""

import time

import torch

from nanorllm.bench.decode_batch import cached_forward
from nanorllm.config import TrainConfig
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.training_engine import training_engine
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import decode_useful_frac


def bench_rollout_batching(policy: HFCausalPolicy, tasks: list[dict], max_new_tokens: int) -> dict:
    """Same episodes, same forced length (no EOS): one batched engine call vs plain generate, one by one."""
    eos = policy.eos_ids
    policy.eos_ids = []  # every response runs to max_new_tokens
    try:
        engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=max_new_tokens), max_turns=1)
        t0 = time.perf_counter()
        results = engine.run(tasks, num_samples=1, seed=0).results
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
    batch = engine.run(tasks[:cfg.tasks_per_step], num_samples=cfg.num_samples_per_task, seed=0)
    step_s = time.perf_counter() - t0
    results, st = batch.results, batch.timings
    samples = [s for r in results for s in r.step_samples]
    batch = max(1, round(st["decode_rows"] / max(st["decode_steps"], 1)))
    context = round(sum(len(s.prompt_ids) + len(s.response_ids) / 2 for s in samples) / len(samples))
    steps = cfg.max_new_tokens
    ids = torch.randint(0, len(policy.tokenizer), (batch, context + steps), device=policy.device)
    mask = torch.ones_like(ids)
    pos = torch.arange(context + steps, device=policy.device).expand(batch, -1)
    with policy.decode_batch(SamplingParams()):  # eval mode, no grad, the policy's autocast
        cache = DynamicCache()
        cached_forward(policy, ids[:, :context], mask[:, :context], pos[:, :context], cache)
        t0 = time.perf_counter()
        for t in range(context, context + steps):  # attention over a growing cache, as in sampling
            cached_forward(policy, ids[:, t:t + 1], mask[:, :t + 1], pos[:, t:t + 1], cache)
        bare_s = time.perf_counter() - t0
    gen_per_s, bare_per_s = st["tokens_kept"] / step_s, batch * steps / bare_s
    return {"decode_useful_frac": decode_useful_frac(st),
            "gen_vs_forward": gen_per_s / bare_per_s, "_step_s": step_s, "_tokens_kept": st["tokens_kept"],
            "_decode_rows": st["decode_rows"], "_decode_steps": st["decode_steps"],
            "_prefill_tokens": st["prefill_tokens"], "_reused_tokens": st["reused_tokens"], "_turns": len(samples),
            "_gen_tokens_per_s": gen_per_s, "_bare_forward_tokens_per_s": bare_per_s, "_mean_batch": batch,
            "_mean_context": context}
