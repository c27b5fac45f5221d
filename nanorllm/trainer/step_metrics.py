"""The step's metrics: the update's, summed as tensors inside the micro-batch loop and made numbers once per
step, and the few a whole step derives from them (`derived_metrics`).

A GPU runs ahead of the host until the host asks for a value; one `float()` per metric per
micro-batch would stall it a dozen times a pass. So the loss's sums and counts (trainer/loss.py) add
up on the learner's device, in float64 like the Python floats they replace, and with the step's host
counts (advantages, groups, padding) and the gradient norm become numbers in one transfer, after one
all-reduce over the learner ranks. That transfer is also what decides whether the update is skipped
(a non-finite loss on any rank, or a non-finite gradient norm).
"""

import math

import torch

SUMMED = ("tokens", "clip_low", "clip_high", "approx_kl", "entropy", "kl", "is_weight_sum", "is_truncated",
          "is_masked", "kl_same_weights", "tokens_same_weights", "kl_lagged", "tokens_lagged", "distill_kl", "distill_kl_sampled", "teacher_lp")


class StepSums:
    """The step's sums over its micro-batches: device tensors in the loop, numbers at the end."""

    def __init__(self, device: torch.device, host: dict[str, float]):
        self.host = host  # counts the host already has (summed over ranks with the rest)
        self.sums = torch.zeros(len(SUMMED) + 2, dtype=torch.float64, device=device)  # + loss, non-finite
        self.is_weight_max = torch.zeros(1, dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        """One micro-batch's loss and its `loss_metrics`: a few kernels, no host synchronisation."""
        loss = loss.detach()
        zero = loss.new_zeros(())
        values = [metrics.get(k, zero) for k in SUMMED] + [loss, (~torch.isfinite(loss)).to(loss.dtype)]
        self.sums += torch.stack(values).double()
        self.is_weight_max = torch.maximum(self.is_weight_max, metrics["is_weight_max"].double().reshape(1))

    def numbers(self, ranks, grad_norm: torch.Tensor | None = None) -> dict[str, float]:
        """Every sum over all ranks (is_weight_max: the largest), and the gradient norm, as floats: the
        step's one host synchronisation."""
        host = torch.tensor(list(self.host.values()), dtype=torch.float64)
        if self.sums.is_cuda:
            host = host.pin_memory().to(self.sums.device, non_blocking=True)
        parts = [ranks.reduce(torch.cat([self.sums, host])), ranks.reduce(self.is_weight_max, op="max")]
        if grad_norm is not None:
            norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: the global norm
            parts.append(norm.detach().double().reshape(1))
        values = torch.cat(parts).tolist()
        keys = [*SUMMED, "loss", "nonfinite", *self.host, "is_weight_max", "grad_norm"]  # zip drops an absent norm
        return dict(zip(keys, values))


def step_metrics(n: dict[str, float], *, correct: bool, kl: bool, distill: bool = False) -> dict:
    """The step's scalars, named as TensorBoard shows them, from `StepSums.numbers` and the update's outcome."""
    adv_n, tokens = max(n["adv_n"], 1), max(n["tokens"], 1.0)
    m = {
        "frac_reward_zero_std": n["zero_std"] / max(n["groups"], 1),
        "advantage/mean": n["adv_sum"] / adv_n,
        "advantage/std": math.sqrt(max(n["adv_sq"] / adv_n - (n["adv_sum"] / adv_n) ** 2, 0.0)),
        "train/samples": int(n["samples"]),
        "train/skipped_nan": int(n["skipped_nan"]),
        "train/masked_truncated": int(n["masked_truncated"]),  # episodes whose loss was masked
        "rollout/groups_short": int(n["groups_short"]),  # trained without their failed episodes
        "rollout/groups_dropped": int(n["groups_dropped"]),  # fewer than --min-group-size left after failures
        "loss/policy": n["loss"], "clip_ratio/low": n["clip_low"] / tokens, "clip_ratio/high": n["clip_high"] / tokens,
        "approx_kl": n["approx_kl"] / tokens, "entropy": n["entropy"] / tokens,
        "train/tokens": n["tokens"], "train/padded_tokens": int(n["padded_tokens"]),
        "perf/pad_frac": 1 - n["real_tokens"] / n["padded_tokens"] if n["padded_tokens"] else 0.0,
    }
    if "grad_norm" in n and not n["skipped_nan"]:
        m["grad_norm"] = n["grad_norm"]
    if kl:
        m["loss/kl"] = n["kl"] / tokens
    if distill:  # per token: KL(student || teacher) over the vocabulary, its sampled estimate, log p_teacher
        m["distill/reverse_kl"] = n["distill_kl"] / tokens
        m["distill/reverse_kl_sampled"] = n["distill_kl_sampled"] / tokens
        m["distill/teacher_logprob"] = n["teacher_lp"] / tokens
    for part in ("same_weights", "lagged"):  # k3 of sampler vs learner before the update, by policy lag
        if n[f"tokens_{part}"]:
            m[f"mismatch/kl_{part}"] = n[f"kl_{part}"] / n[f"tokens_{part}"]
    if correct:
        m.update({"is_weight/mean": n["is_weight_sum"] / tokens, "is_weight/max": n["is_weight_max"],
                  "is_weight/truncated_frac": n["is_truncated"] / tokens,
                  "is_weight/masked_frac": n["is_masked"] / tokens})
    return m


def derived_metrics(m: dict, results: list, *, step_s: float, skipped_nan_total: int) -> dict:
    """The scalars a whole step adds to the update's and the rollout source's metrics `m`."""
    gen_tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
    return {
        "train/skipped_nan_total": skipped_nan_total,
        "perf/step_s": step_s,
        "perf/train_tokens_per_s": m["train/tokens"] / max(m["perf/train_s"], 1e-9),
        "perf/tokens_per_s": (gen_tokens + m["train/padded_tokens"]) / step_s,
        # approx_kl is measured before the update: sampler vs learner logprobs on the same tokens
        # (policy lag plus numerical differences between the decode and the training forward).
        "pipeline/mismatch_kl": m["approx_kl"],
        "train/episodes": len(results),
        "perf/episodes_per_s": len(results) / step_s,
    }


def merge_updates(ns: list[dict[str, float]]) -> dict[str, float]:
    """Several `update` results of one rollout batch (updates_per_batch x epochs) as one: sums and counts
    added (the host counts come with the first only), the largest is_weight_max, the loss and gradient
    norm averaged over the optimizer steps taken, skipped_nan the number skipped."""
    out = {k: sum(n.get(k, 0.0) for n in ns) for k in ns[0] if k not in ("grad_norm", "perf/gather_s")}
    out["is_weight_max"] = max(n["is_weight_max"] for n in ns)
    out["loss"] = out["loss"] / len(ns)
    norms = [n["grad_norm"] for n in ns if "grad_norm" in n and not n["skipped_nan"]]
    if norms:
        out["grad_norm"] = sum(norms) / len(norms)
    if any("perf/gather_s" in n for n in ns):
        out["perf/gather_s"] = sum(n.get("perf/gather_s", 0.0) for n in ns)
    out["optimizer_steps"] = float(sum(1 for n in ns if "grad_norm" in n and not n["skipped_nan"]))
    return out


def console_line(step: int, max_steps: int, m: dict) -> str:
    """A step's line on the console, from its scalars."""
    line = (f"step {step}/{max_steps} | reward {m.get('reward/mean', 0):.2f} | success "
            f"{m.get('success_rate', 0):.2f} | first {m.get('success_rate/first_turn', 0):.2f} | "
            f"loss {m.get('loss/policy', 0):+.4f} | ")
    if "pipeline/policy_lag_mean" in m:
        line += f"lag {m['pipeline/policy_lag_mean']:.1f} | "
    return line + f"{m['perf/step_s']:.1f} s"
