"""Learner figure: train_step's tokens/s against a bare forward + backward + optimizer step on the same batch."""

import time
from dataclasses import replace

from nanorllm.bench.packing import sampled_episodes
from nanorllm.config import TrainConfig
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer


def bench_learner(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict]) -> dict:
    results = sampled_episodes(policy, cfg, tasks, samples=cfg.num_samples_per_task)
    cfg = replace(cfg, drop_zero_std_groups=False, micro_batch_tokens=10**9)
    opt = make_optimizer(policy, cfg)
    train_step(policy, opt, results, cfg)  # warm-up
    m = train_step(policy, opt, results, cfg)
    ours = m["train/tokens"] / m["perf/train_s"]
    batch = collate_train_batch([s for r in results for s in r.step_samples], pad_id=policy.pad_id,
                                device=policy.device)
    labels = batch["input_ids"].masked_fill(batch["loss_mask"] == 0, -100)
    policy.model.train()
    for _ in range(2):  # warm-up, then timed
        t0 = time.perf_counter()
        loss = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        bare_s = time.perf_counter() - t0
    return {"learner_efficiency": ours / (m["train/tokens"] / bare_s), "_train_step_s": m["perf/train_s"],
            "_bare_s": bare_s, "_tokens": m["train/tokens"]}
