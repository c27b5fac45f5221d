"""What --env, --agent and the reward sources mean together: one decision every program (training,
evaluation, supervised fine-tuning) takes from here, so `--reward f.py:fn` without `--env` means the same
one-turn episodes wherever it is given."""

from nanorllm.config.fields import AllOf, EnvSource, JudgeSettings, RewardFunctions
from nanorllm.envs.registry import DEFAULT_ENV
from nanorllm.rewards.sources import reward_source_specs


def episode_env(cfg: AllOf[EnvSource, RewardFunctions, JudgeSettings], *, env_given: bool) -> str:
    """The env a program's episodes run, for training, evaluation and every other program alike: --env when it
    was given (`env_given`, even as the default; a resumed or evaluated run's saved env counts as given);
    without it, reward sources (--reward, --reward-model, --judge) score one-turn episodes alone ('single'),
    unless an --agent is the episode; else the default env."""
    scored = reward_source_specs(cfg)
    if scored and not env_given and not cfg.agent and cfg.env == DEFAULT_ENV:
        return "single"
    return cfg.env
