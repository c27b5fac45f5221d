"""One GRPO step, in the order of the design notes:

    results = collect_rollouts(engine, tasks, num_samples_per_task)
    groups  = group_by_task_id(results)
    groups  = compute_advantage(groups)
    samples = flatten_step_samples(groups)
    batch   = collate_train_batch(samples, pad_id=...)
    out     = policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"], batch["shared_columns"])
    loss, _ = compute_policy_loss(out.logits, batch)
    loss.backward(); optimizer.step()

`train_step` is exactly that: the first four lines here, the rest in `update` (trainer/update.py:
micro-batches, the NaN guard, the optimizer step), then the step's scalars (trainer/step_metrics.py).
With `mask_truncated`, episodes cut at max_new_tokens still count in their group's advantage but
contribute no gradient (DAPO's overlong filtering).
"""

import time

from nanorllm.algos.grpo import (compute_advantage, drop_env_errors, flatten_step_samples, group_by_task_id,
                                 is_zero_std)
from nanorllm.core.types import RolloutResult
from nanorllm.ranks.group import ONE_RANK
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.precision import matmul_precision
from nanorllm.trainer.step_metrics import step_metrics
from nanorllm.trainer.update import update


def collect_rollouts(engine: RolloutEngine, tasks: list[dict], num_samples_per_task: int, *,
                     group_ids: list[str] | None = None, seed: int | None = None) -> list[RolloutResult]:
    """num_samples_per_task episodes for each task, all batched together by the engine."""
    return engine.run(tasks, num_samples=num_samples_per_task, group_ids=group_ids, seed=seed).results


def train_step(policy, optimizer, results: list[RolloutResult], cfg, *, ref_policy=None, ranks=None) -> dict:
    """group -> advantage -> flatten -> update -> the step's scalars.

    With learner `ranks` (ranks/group.py) `results` is this rank's share of the step (whole groups):
    the normaliser and every metric are the whole step's, over all ranks."""
    t0 = time.perf_counter()
    ranks = ranks or ONE_RANK
    results, short, dropped = drop_env_errors(results)
    groups = compute_advantage(group_by_task_id(results), normalize_std=cfg.adv_normalize_std, eps=cfg.adv_eps,
                               turn_credit=cfg.turn_credit, turn_gamma=cfg.turn_gamma)
    samples = flatten_step_samples(groups, drop_zero_std=cfg.drop_zero_std_groups)
    truncated = {s.episode_id for s in samples if s.truncated} if cfg.mask_truncated else set()
    samples = [s for s in samples if s.episode_id not in truncated]
    advs = [r.step_samples[0].advantage for rs in groups.values() for r in rs if r.step_samples]
    host = {"zero_std": sum(is_zero_std(rs) for rs in groups.values()), "groups": len(groups), "adv_n": len(advs),
            "adv_sum": sum(advs), "adv_sq": sum(a * a for a in advs), "masked_truncated": len(truncated),
            "groups_short": short, "groups_dropped": dropped}
    with matmul_precision(policy.device, tf32=cfg.tf32):
        n = update(policy, optimizer, samples, cfg, ranks=ranks, ref_policy=ref_policy, host=host)
    m = step_metrics(n, correct=cfg.off_policy_correction != "none", kl=cfg.kl_coef > 0)
    m.update({"lr": optimizer.param_groups[0]["lr"], "perf/micro_batches": n["micro_batches"],
              "perf/train_s": time.perf_counter() - t0})
    if "perf/gather_s" in n:  # FSDP: the new weights gathered into rank 0's full model
        m["perf/gather_s"] = n["perf/gather_s"]
    return m
