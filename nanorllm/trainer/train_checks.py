"""What fails a run while it trains: an update that left a weight inf or NaN, and too many updates that trained
nothing (each skipped for a non-finite loss or gradient, or with every group dropped)."""

import torch

from nanorllm.algos.groups import group_by_task_id
from nanorllm.config import TrainConfig
from nanorllm.core.types import RolloutResult
from nanorllm.policy.lora import trainable_parameters


class TrainedNothing(RuntimeError):
    """Too many of the run's updates trained nothing: it must not end as a finished run."""


class NonFiniteWeights(RuntimeError):
    """An update left a weight inf or NaN: nothing after it can be trained or saved."""


def check_finite_weights(model: torch.nn.Module, step: int) -> None:
    """One fused norm per trained parameter (a frozen LoRA base cannot change) and one sync per step; raises
    NonFiniteWeights naming the first bad tensor."""
    named = [(n, p) for n, p in trainable_parameters(model) if p.is_floating_point()]
    norms = torch._foreach_norm([p.detach() for _, p in named])
    finite = torch.isfinite(torch.stack([n.float() for n in norms]))
    if not bool(finite.all()):
        bad = named[int((~finite).nonzero()[0])][0]
        raise NonFiniteWeights(f"step {step}'s update left non-finite weights (first: {bad}); the run stops and the "
                               "last checkpoint, whose weights are finite, stands (try a smaller --lr)")


def count_untrained(totals: dict, results: list[RolloutResult], metrics: dict) -> None:
    """The step's update into the run's `totals`: skipped (a non-finite loss or gradient), or with every group
    dropped (env errors, failed reward scores); the latter's running count into the step's `metrics` too."""
    totals["skipped_nan"] += metrics["train/skipped_nan"]
    totals["env_error_steps"] = totals.get("env_error_steps", 0) + (  # every group dropped
        bool(results) and metrics["rollout/groups_dropped"] == len(group_by_task_id(results)))
    metrics["train/env_error_steps_total"] = totals["env_error_steps"]


def check_trained(cfg: TrainConfig, totals: dict, steps: int, *, at_end: bool) -> None:
    """Raise TrainedNothing once more than --max-skipped-frac of --max-steps updates trained nothing (the share is
    out of reach: stop now), or at the end if every one of the `steps` updates did (`totals`: the run's counts)."""
    nan, env = totals["skipped_nan"], totals.get("env_error_steps", 0)
    skipped, limit = nan + env, cfg.max_skipped_frac
    if skipped > limit * cfg.max_steps or (at_end and skipped >= steps > 0):
        raise TrainedNothing(
            f"{skipped} of {steps} updates trained nothing ({nan} skipped for a non-finite loss or "
            f"gradient, {env} with every group dropped for env errors or failed reward scores: see the [env] and "
            f"[reward] lines above), more than "
            f"--max-skipped-frac {limit:g} of --max-steps {cfg.max_steps}; the run is not done")
