"""The small typed specs the lower floors take, read off a TrainConfig here, in one place.

A floor below the trainer never reads a TrainConfig field: the policy gets a `LoraSpec`, the engine its
`SamplingParams` and turn limit, an env its `EnvSpec` (with the `EpisodeSettings` every bundle may read).
So policy/, envs/ and rollout/ depend on the types they are handed, which an import shows, not on the
config's field names, which nothing would. Each builder takes the config groups it reads (fields.py): one
group's type, or `AllOf[...]` the groups it needs all of; their defaults are the specs' (tests/test_config_groups.py
checks every one); a group a program does not compose (an evaluation has no reward model) gives no part. The reward
sources' specs are each read off its own group by its module (rewards/sources.py `reward_source_specs`).
"""

from dataclasses import replace

from nanorllm.config.fields import (AllOf, EnvOptions, EnvSource, Episodes, EpisodeShape, FirstPrompt, LoraAdapters,
                                    PromptLimit, RewardFunctions, Sampling, TaskSampling, ToolSettings, Turns)
from nanorllm.datasets.sampler import SamplerSpec
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import EnvSpec
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.lora import LoraSpec, effective_alpha
from nanorllm.rewards.sources import reward_source_specs


def lora_spec(cfg: LoraAdapters) -> LoraSpec | None:
    """The run's LoRA settings (the lora_* fields); None for a full fine-tune."""
    if not cfg.lora_rank:
        return None
    return LoraSpec(rank=cfg.lora_rank, alpha=effective_alpha(cfg.lora_rank, cfg.lora_alpha),
                    dropout=cfg.lora_dropout, targets=cfg.lora_targets)


def sampler_spec(cfg: TaskSampling) -> SamplerSpec | None:
    """The signal sampler's settings; None for the uniform order."""
    if cfg.task_sampler == "uniform":
        return None
    return SamplerSpec(band=tuple(cfg.sampler_band), explore=cfg.sampler_explore, revisit=cfg.sampler_revisit)


def sampling_params(cfg: AllOf[Sampling, Turns]) -> SamplingParams:
    """How training rollouts sample (evaluation replaces the temperature or decodes greedily)."""
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)


def episode_settings(cfg: AllOf[EnvSource, EpisodeShape]) -> EpisodeSettings:
    """The episode fields every bundle may read."""
    return replace(prompt_settings(cfg), max_turns=cfg.max_turns, grader_timeout_s=cfg.grader_timeout_s,
                   env_timeout_s=cfg.env_timeout_s, max_row_tokens=agent_row_tokens(cfg), opponent=cfg.opponent,
                   eval_opponent=cfg.eval_opponent)


def prompt_settings(cfg: AllOf[EnvOptions, FirstPrompt]) -> EpisodeSettings:
    """What a bundle's first prompt and task sources read (the system prompt, the worked example, the task
    columns), the turn and time limits at EpisodeSettings' own: what a program that plays no episode (SFT's
    demonstrations) hands a bundle. A --task-fields the config's checks refuse reads as none."""
    from nanorllm.datasets.golds import TaskFieldsError, parse_task_fields

    try:
        task_fields = parse_task_fields(cfg.task_fields)
    except TaskFieldsError:
        task_fields = None  # config_problems names the field
    return EpisodeSettings(system_prompt=cfg.system_prompt, worked_example=cfg.worked_example, task_fields=task_fields)


def agent_row_tokens(cfg: EpisodeShape | Episodes) -> int | None:
    """The most tokens an --agent episode's row may hold: --max-prompt-tokens plus the room its turns need
    (their responses and feedback, as an env episode is sized); None without --max-prompt-tokens (the model's
    context bounds it), or for a config with the episode shape alone (evaluation's: no prompt limit)."""
    from nanorllm.rollout.engine import longest_episode

    if not isinstance(cfg, PromptLimit) or not cfg.max_prompt_tokens:
        return None
    return longest_episode(cfg.max_prompt_tokens, sampling_params(cfg), cfg.max_turns)


def env_spec(cfg: AllOf[EnvSource, ToolSettings, RewardFunctions, EpisodeShape]) -> EnvSpec:
    """What names the run's episodes: its --agent, or its --env with its options, --tools, --reward functions,
    --reward-model and --judge."""
    return EnvSpec(env=cfg.env, env_args=cfg.env_arg, agent=cfg.agent, agent_timeout_s=cfg.agent_timeout_s,
                   tool_parser=cfg.tool_parser, reward_sources=reward_source_specs(cfg), reward_mode=cfg.reward_mode,
                   tools=cfg.tools, max_tool_calls=cfg.max_tool_calls, tool_timeout_s=cfg.tool_timeout_s,
                   settings=episode_settings(cfg))


def run_bundle(cfg, env=None):
    """The run's env bundle: `env`, the one the caller already built (a process builds it once), else the bundle
    the config names, built now."""
    from nanorllm.envs.registry import load_bundle

    return env if env is not None else load_bundle(env_spec(cfg))


def task_specs(cfg, env=None) -> tuple[str | None, str]:
    """(training, held-out) task specs of a config: the fields it sets, else its env's own defaults (held-out ''
    when the env has none); `env` is the run's bundle, built from the config when not given."""
    from nanorllm.envs.registry import resolve_task_specs

    env = run_bundle(cfg, env)
    return resolve_task_specs(cfg.tasks, cfg.eval_tasks, env)
