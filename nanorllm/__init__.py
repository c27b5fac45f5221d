"""nanorllm: a small, readable RL trainer for language models.

The names of the design notes and the entry points, importable from the package root so that user
code survives moves inside it:

    from nanorllm import TrainConfig, run_training
    from nanorllm import collect_rollouts, group_by_task_id, compute_advantage, flatten_step_samples

Each is imported on first use (torch and transformers load only then).
"""

import importlib

_HOMES = {
    "Step": "nanorllm.core.types",
    "Trajectory": "nanorllm.core.types",
    "StepSample": "nanorllm.core.types",
    "RolloutResult": "nanorllm.core.types",
    "RolloutBatch": "nanorllm.core.types",
    "EnvBundle": "nanorllm.envs.base",
    "MathEnv": "nanorllm.envs.math_env",
    "MathAgent": "nanorllm.agents.math_agent",
    "HFCausalPolicy": "nanorllm.policy.hf_causal",
    "SamplingParams": "nanorllm.policy.base",
    "RolloutEngine": "nanorllm.rollout.engine",
    "group_by_task_id": "nanorllm.algos.groups",
    "compute_advantage": "nanorllm.algos.advantages",
    "flatten_step_samples": "nanorllm.algos.groups",
    "collect_rollouts": "nanorllm.trainer.step",
    "collate_train_batch": "nanorllm.trainer.collate",
    "compute_policy_loss": "nanorllm.trainer.loss",
    "LossSettings": "nanorllm.config.fields",
    "Objective": "nanorllm.config.fields",
    "TrainConfig": "nanorllm.config",
    "run_training": "nanorllm.run.lifecycle",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'nanorllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
