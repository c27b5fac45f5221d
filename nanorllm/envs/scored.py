"""An env bundle whose episodes the run's reward sources score too (--reward, --reward-model, --judge), as
envs/tools.py's ToolBundle is one whose episodes may call tools: a wrapper, so every env, built-in or a user's,
takes reward sources the same way. The scoring itself, and the rule that a failed score is no zero, live with the
sources (rewards/functions.py RewardSources)."""

from typing import Callable

from nanorllm.core.types import RolloutResult
from nanorllm.envs.base import EnvBundle
from nanorllm.rewards.functions import RewardSources


class RewardBundle(EnvBundle):
    """`inner`'s episodes, scored (also) by reward sources (`functions`: RewardFunction objects, a reward model, a
    judge); everything else is `inner`'s."""

    def __init__(self, inner: EnvBundle, functions: list, mode: str = "add"):
        self.inner, self.sources = inner, RewardSources(functions, mode)
        self.settings, self.options, self.spec, self.name = inner.settings, inner.options, inner.spec, inner.name
        self.default_tasks, self.default_eval_tasks = inner.default_tasks, inner.default_eval_tasks

    def make_env(self):
        return self.inner.make_env()

    def make_agent(self):
        return self.inner.make_agent()

    def use_tokenizer(self, tokenizer) -> None:
        self.inner.use_tokenizer(tokenizer)

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        """`inner`'s tasks, refused (TaskFileError) when a function takes a column they lack."""
        tasks = self.inner.load_tasks(spec, limit=limit)
        self.sources.check_tasks(spec, tasks)
        return tasks

    def metrics(self, results: list[RolloutResult]) -> dict:
        """`inner`'s and the sources' (reward/<name>, reward/failed/<name>, a source's own)."""
        return {**self.inner.metrics(results), **self.sources.metrics(results)}

    def use_device(self, device) -> None:
        self.sources.use_device(device)

    def score_batch(self, results: list[RolloutResult],
                    watch: Callable[[str], None] = lambda activity: None) -> None:
        """The sources' scores of the call's episodes, set in place (RewardSources.score_batch)."""
        self.sources.score_batch(results, self.name, watch)
