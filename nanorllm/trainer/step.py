"""One GRPO step, in the order of the design notes:

    results = collect_rollouts(engine, tasks, num_samples_per_task)
    groups  = group_by_task_id(results)
    groups  = compute_advantage(groups)
    samples = flatten_step_samples(groups)
    batch   = collate_train_batch(samples, pad_id=...)
    out     = policy.forward(batch["input_ids"], batch["attention_mask"])
    loss, _ = compute_policy_loss(out.logits, batch, cfg)
    loss.backward(); optimizer.step()

`train_step` is exactly that: the first four lines here, the rest in `update` (trainer/update.py: micro-batches,
the NaN guard, the optimizer step; its forward also gives `batch["positions"]` and `batch["shared_columns"]`, so
the head runs on the scored tokens alone and the shared prompt template once), then the step's scalars
(trainer/step_metrics.py).
With `mask_truncated`, episodes cut at max_new_tokens still count in their group's advantage but
contribute no gradient (DAPO's overlong filtering); with `overlong_buffer` their reward is shaped
before the advantage (DAPO's soft overlong punishment).

Several optimizer steps per rollout batch (`updates_per_batch` K, `epochs` E): the batch's groups
(those that train) are cut into K mini-batches by task-stream position mod K, each one `update`, and the
whole is done E times; the step (its number, its checkpoint, the weights published after it) is
still the rollout batch. Without a correction every step's ratio is to the policy that sampled
(PPO's clip); with one, pi_prox is the batch's first policy (one no-grad forward before the first
step). The learning rate is the step's (`lr_schedule`, trainer/schedule.py).
"""

import time
import zlib

from nanorllm.algos.advantages import compute_advantage, overlong_penalty, silent_groups
from nanorllm.algos.groups import drop_failed, flatten_step_samples, group_by_task_id
from nanorllm.core.types import RolloutResult, StepSample
from nanorllm.ranks.group import ONE_RANK
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.loss import PolicyLoss
from nanorllm.trainer.precision import matmul_precision
from nanorllm.trainer.schedule import lr_at
from nanorllm.trainer.step_metrics import merge_updates, step_metrics
from nanorllm.trainer.update import batch_proximal_logprobs, update


def collect_rollouts(engine: RolloutEngine, tasks: list[dict], num_samples_per_task: int, *,
                     group_ids: list[str] | None = None, seed: int | None = None) -> list[RolloutResult]:
    """num_samples_per_task episodes for each task, all batched together by the engine."""
    return engine.run(tasks, num_samples=num_samples_per_task, group_ids=group_ids, seed=seed).results


def train_step(policy, optimizer, results: list[RolloutResult], cfg, *, ref_policy=None, teacher=None,
               ranks=None, role_baselines: dict[str, float] | None = None) -> dict:
    """group -> advantage -> flatten -> update -> the step's scalars.

    With learner `ranks` (ranks/group.py) `results` is this rank's share of the step (whole groups):
    the normaliser and every metric are the whole step's, over all ranks. With a distillation `teacher`
    (trainer/teacher.py) every group trains: the teacher scores each token, whatever the group's rewards.
    `role_baselines`: the rae estimator's baselines (one per game and seat), updated in place; the run keeps them."""
    t0 = time.perf_counter()
    ranks = ranks or ONE_RANK
    results, short, dropped = drop_failed(results, cfg.min_group_size)
    penalty = {id(r): overlong_penalty(r, max_new_tokens=cfg.max_new_tokens, buffer=cfg.overlong_buffer,
                                       penalty=cfg.overlong_penalty) for r in results} if cfg.overlong_buffer else None
    groups = group_by_task_id(results)
    # the groups without signal, once: zeroed and dropped here, counted below (fill-batch's test too)
    # (under rae none: each episode is set against its role's running baseline, not its group)
    silent = set() if cfg.adv_estimator == "rae" else \
        silent_groups(groups, turn_credit=cfg.turn_credit, turn_gamma=cfg.turn_gamma)
    compute_advantage(groups, normalize_std=cfg.adv_normalize_std, eps=cfg.adv_eps, turn_credit=cfg.turn_credit,
                      turn_gamma=cfg.turn_gamma, estimator=cfg.adv_estimator,
                      reward_of=(lambda r: r.reward + penalty[id(r)]) if penalty else None,
                      batch_stats=ranks.all_sum, silent=silent, std=cfg.adv_std, role_baselines=role_baselines,
                      rae_decay=cfg.rae_decay)
    samples = flatten_step_samples(groups, drop_zero_std=cfg.drop_zero_std_groups and teacher is None, silent=silent)
    truncated = {s.episode_id for s in samples if s.truncated} if cfg.mask_truncated else set()
    samples = [s for s in samples if s.episode_id not in truncated]
    host = step_counts(groups, silent=silent, truncated=truncated, short=short, dropped=dropped, penalty=penalty)
    set_step_lr(optimizer, policy.version, cfg)
    with matmul_precision(policy.device, tf32=cfg.tf32):
        if cfg.updates_per_batch == 1 and cfg.epochs == 1:
            n = update(policy, optimizer, samples, cfg, ranks=ranks, loss=PolicyLoss(cfg, ref_policy, teacher),
                       host=host)
        else:
            group_of = {s.episode_id: g for g, rs in groups.items() for r in rs for s in r.step_samples}
            n = several_updates(policy, optimizer, samples, cfg, ranks=ranks, ref_policy=ref_policy, teacher=teacher,
                                host=host, group_of=group_of)
    return step_scalars(n, cfg, lr=optimizer.param_groups[0]["lr"], train_s=time.perf_counter() - t0)


def step_counts(groups: dict, *, silent: set[str], truncated: set[str], short: int, dropped: int,
                penalty: dict | None) -> dict:
    """The step's host-side counts that the update's sums carry over every rank (advantages, groups, masks; the
    overlong penalties when --overlong-buffer shapes rewards)."""
    advs = [r.step_samples[0].advantage for rs in groups.values() for r in rs if r.step_samples]
    host = {"zero_std": len(silent), "groups": len(groups), "adv_n": len(advs),
            "adv_sum": sum(advs), "adv_sq": sum(a * a for a in advs), "masked_truncated": len(truncated),
            "groups_short": short, "groups_dropped": dropped}
    if penalty is not None:
        host["overlong_penalty"] = sum(penalty.values())
    return host


def set_step_lr(optimizer, version: int, cfg) -> None:
    """The learning rate of the step the policy is at (`lr_schedule` after `warmup_steps`; constant: untouched)."""
    if cfg.lr_schedule != "constant" or cfg.warmup_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(version, lr=cfg.lr, schedule=cfg.lr_schedule, warmup_steps=cfg.warmup_steps,
                                max_steps=cfg.max_steps)


def step_scalars(n: dict, cfg, *, lr: float, train_s: float) -> dict:
    """The step's scalars from the update's numbers (trainer/step_metrics.py) and what the step adds."""
    m = step_metrics(n, correct=cfg.off_policy_correction != "none", kl=cfg.kl_coef > 0,
                     distill=cfg.teacher is not None)
    m.update({"lr": lr, "perf/micro_batches": n["micro_batches"], "perf/train_s": train_s})
    if "perf/gather_s" in n:  # FSDP: the new weights gathered into rank 0's full model
        m["perf/gather_s"] = n["perf/gather_s"]
    if cfg.updates_per_batch > 1 or cfg.epochs > 1:
        m["train/optimizer_steps"] = int(n["optimizer_steps"])
    if cfg.overlong_buffer:
        m["train/overlong_penalty"] = n["overlong_penalty"] / max(n["adv_n"], 1)
    return m


def mini_batch_of(group_id: str, k: int) -> int:
    """Which of k mini-batches a group trains in: its task-stream position (`<task_id>@<position>`) mod k, so
    a step's consecutive positions spread evenly and every learner rank, holding only its share of the
    groups, puts each in the same mini-batch one rank would (a group id without a position: its crc32)."""
    tail = group_id.rsplit("@", 1)[-1]
    return (int(tail) if "@" in group_id and tail.isdigit() else zlib.crc32(group_id.encode())) % k


def mini_batches(samples: list[StepSample], k: int, group_of: dict[str, str]) -> list[list[StepSample]]:
    """`samples` cut into k mini-batches of whole groups (`group_of`: episode_id -> group id), order kept;
    some are empty when there are fewer groups than k."""
    out: list[list[StepSample]] = [[] for _ in range(k)]
    for s in samples:
        out[mini_batch_of(group_of[s.episode_id], k)].append(s)
    return out


def several_updates(policy, optimizer, samples: list[StepSample], cfg, *, ranks, ref_policy, teacher=None,
                    host: dict, group_of: dict[str, str]) -> dict:
    """epochs x updates_per_batch optimizer steps on one rollout batch; their sums merged (merge_updates)."""
    prox = None
    if cfg.off_policy_correction != "none":  # the batch's first policy, before any of its steps
        prox = batch_proximal_logprobs(policy, samples, cfg, ranks=ranks)
    loss = PolicyLoss(cfg, ref_policy, teacher, prox)
    parts = mini_batches(samples, cfg.updates_per_batch, group_of)
    ns = []
    zeros = dict.fromkeys(host, 0.0)
    for _ in range(cfg.epochs):
        for part in parts:
            ns.append(update(policy, optimizer, part, cfg, ranks=ranks, loss=loss, host=host if not ns else zeros))
    return merge_updates(ns)
